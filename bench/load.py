"""The closed-loop load generator the served benchmarks share: planned requests
(OpenAI ``/v1/embeddings`` bodies of corpus texts), clients that send them back
to back, and what one level of load measured."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import random
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from numpy.typing import NDArray

from bench import report, texts
from bench.peers.compare import worst_cosine

HOST = "127.0.0.1"  # the load generator never targets anything else
MAX_INPUTS = 8


@dataclass
class Level:
    concurrency: int
    elapsed_s: float = 0.0
    sent: int = 0
    ok: int = 0
    tokens: int = 0  # as the server reports them (usage.prompt_tokens)
    expected_tokens: int = 0  # as the corpus counts them: the same for every server
    latencies_s: list[float] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)
    inference_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    token_mismatches: int = 0
    batches: float = 0.0  # what the worker ran meanwhile, from /metrics
    batch_requests: float = 0.0
    batch_tokens: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)

    def summary(self, ceiling: float) -> dict[str, Any]:
        ms = [s * 1e3 for s in self.latencies_s]
        rate = self.tokens / self.elapsed_s if self.elapsed_s else 0.0
        return {
            "concurrency": self.concurrency,
            "elapsed_s": round(self.elapsed_s, 3),
            "requests": self.sent,
            "ok": self.ok,
            "errors": dict(self.errors),
            "requests_per_s": self.ok / self.elapsed_s if self.elapsed_s else 0.0,
            "tokens_per_s": rate,
            "share_of_engine_ceiling": rate / ceiling if ceiling else None,
            "latency_ms": {
                "p50": report.percentile(ms, 50),
                "p90": report.percentile(ms, 90),
                "p99": report.percentile(ms, 99),
                "max": max(ms) if ms else float("nan"),
            },
            "server_queue_ms_p50": report.percentile(self.queue_ms, 50),
            "server_inference_ms_p50": report.percentile(self.inference_ms, 50),
            "token_count_mismatches": self.token_mismatches,
            "batches": self.batches,
            "mean_requests_per_batch": self.batch_requests / self.batches if self.batches else None,
            "mean_tokens_per_batch": self.batch_tokens / self.batches if self.batches else None,
            "cpu": self.cpu,
        }


@dataclass(frozen=True)
class Plan:
    """The requests, built once: bodies and the tokens each should report."""

    bodies: list[bytes]
    texts: list[list[str]]
    tokens: list[int]  # what usage.prompt_tokens should say: inputs cut to the model's limit


def plan_requests(
    corpus: texts.Corpus,
    model: str,
    max_tokens: int,
    count: int,
    seed: int,
    encoding: str,
    inputs_per_request: tuple[int, int] = (1, MAX_INPUTS),
) -> Plan:
    """``count`` requests of consecutive corpus texts, each of a uniform draw from
    ``inputs_per_request`` (inclusive) texts."""
    rng = random.Random(seed)
    cursor = itertools.cycle(range(len(corpus.texts)))
    bodies: list[bytes] = []
    inputs: list[list[str]] = []
    tokens: list[int] = []
    for _ in range(count):
        picked = [next(cursor) for _ in range(rng.randint(*inputs_per_request))]
        texts_ = [corpus.texts[i] for i in picked]
        body = {"model": model, "input": texts_, "encoding_format": encoding}
        bodies.append(json.dumps(body).encode())
        inputs.append(texts_)
        tokens.append(sum(min(corpus.lengths[i], max_tokens) for i in picked))
    return Plan(bodies, inputs, tokens)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


async def run_level(
    session: aiohttp.ClientSession,
    url: str,
    plan: Plan,
    level: Level,
    duration_s: float,
    max_requests: int,
    offset: int,
) -> None:
    """``level.concurrency`` closed-loop clients; no request starts after ``duration_s``
    or beyond ``max_requests``; the level ends when the last reply is in."""
    counter = itertools.count()
    start = time.perf_counter()
    stop_at = start + duration_s

    async def client() -> None:
        while time.perf_counter() < stop_at:
            n = next(counter)
            if n >= max_requests:
                return
            i = (offset + n) % len(plan.bodies)
            level.sent += 1
            sent_at = time.perf_counter()
            try:
                async with session.post(
                    url, data=plan.bodies[i], headers={"content-type": "application/json"}
                ) as response:
                    payload = await response.read()
                    status = response.status
                    headers = response.headers
            except (aiohttp.ClientError, TimeoutError) as exc:
                level.errors[type(exc).__name__] += 1
                continue
            if status != 200:
                level.errors[str(status)] += 1
                if status in (429, 503):  # back off a little instead of spinning
                    await asyncio.sleep(0.05)
                continue
            level.latencies_s.append(time.perf_counter() - sent_at)
            level.ok += 1
            level.expected_tokens += plan.tokens[i]
            tokens = int(json.loads(payload)["usage"]["prompt_tokens"])
            level.tokens += tokens
            level.token_mismatches += tokens != plan.tokens[i]
            with contextlib.suppress(KeyError, ValueError):
                level.queue_ms.append(float(headers["x-queue-time"]))
                level.inference_ms.append(float(headers["x-inference-time"]))

    await asyncio.gather(*(client() for _ in range(level.concurrency)))
    level.elapsed_s = time.perf_counter() - start


async def batch_counters(session: aiohttp.ClientSession, port: int) -> tuple[float, float, float]:
    """(batches, requests, tokens) the worker has run so far, from its /metrics."""
    async with session.get(f"http://{HOST}:{port}/metrics") as response:
        text = await response.text()
    values = {"batches": 0.0, "requests": 0.0, "tokens": 0.0}
    names = {
        "flotilla_batch_requests_count": "batches",
        "flotilla_batch_requests_sum": "requests",
        "flotilla_batch_tokens_sum": "tokens",
    }
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in names:
            values[names[name]] += float(rest.rsplit(" ", 1)[1])
    return values["batches"], values["requests"], values["tokens"]


async def fetch_vectors(
    session: aiohttp.ClientSession, url: str, model: str, inputs: list[str]
) -> NDArray[np.float32]:
    """The server's vectors for ``inputs`` (base64 float32, OpenAI's format), as sent."""
    body = {"model": model, "input": inputs, "encoding_format": "base64"}
    async with session.post(url, json=body) as response:
        response.raise_for_status()
        data = await response.json()
    return np.stack(
        [
            np.frombuffer(base64.b64decode(item["embedding"]), dtype=np.float32)
            for item in data["data"]
        ]
    )


async def check_vectors(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    inputs: list[str],
    expected: NDArray[np.float32],
) -> float:
    """Worst cosine between the server's vectors and ``expected``, same texts."""
    return worst_cosine(await fetch_vectors(session, url, model, inputs), expected)
