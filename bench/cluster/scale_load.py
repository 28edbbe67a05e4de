"""The cluster-scale run's workloads as HTTP requests, and the open-loop client.

A workload is the simulation's (``bench.cluster.workloads``: the same request sizes,
models and arrival instants for a seed) on a cluster of emulated devices:

- ``small``: 1-3 inputs of 8-32 tokens, every device alike;
- ``hetero``: the same requests, a quarter of the devices 3x slower;
- ``multimodel``: small requests over 4 models (48/24/16/12% of them), each worker
  hosting 2 of the 4 (``emulation.hosting_map``): a router picks among the hosts;
- ``bursty``: small requests in on/off bursts (twice the mean rate when on).

Texts are made of words that the MiniLM tokenizer keeps as one token each, so an input
of n tokens is n - 2 words ([CLS] and [SEP] count). Tokens served are what the answers
say (``usage.prompt_tokens``). The client is open loop: each request leaves at its
arrival instant whatever the answers before it did, so a slow path meets the same
load and queues; the run's latency is from that instant.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from bench.cluster.cost_model import CostModel
from bench.cluster.workloads import Workload, capacity, make_workload

WORKLOADS = ("small", "hetero", "multimodel", "bursty")
MODELS = ("m0", "m1", "m2", "m3")  # the fleet's names; all the same emulated model
SIM_WORKLOAD = {"small": "small", "hetero": "small", "multimodel": "multimodel", "bursty": "bursty"}
SLOW_SHARE = {"hetero": 0.25}  # the share of devices SLOW_FACTOR times slower
SLOW_FACTOR = 3.0
MODELS_PER_WORKER = {"multimodel": 2}  # else every worker hosts every model
WORDS = (
    "the",
    "data",
    "model",
    "system",
    "time",
    "world",
    "water",
    "city",
    "house",
    "music",
    "school",
    "light",
    "market",
    "river",
    "paper",
    "energy",
)


def text_of(tokens: int, seed: int) -> str:
    """An input that tokenizes to ``tokens`` tokens (specials included)."""
    n = max(1, tokens - 2)
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n))


@dataclass(frozen=True)
class Requests:
    name: str
    bodies: list[bytes]
    models: list[str]
    tokens: list[int]  # expected, [CLS]/[SEP] included
    workload: Workload

    def arrivals(self, rate: float) -> list[float]:
        return self.workload.arrivals(rate)


def build(name: str, n: int, cost: CostModel, seed: int) -> Requests:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    workload = make_workload(SIM_WORKLOAD[name], n, cost, seed)
    bodies, models = [], []
    for k, lengths in enumerate(workload.lengths):
        model = MODELS[workload.models[k]]
        inputs = [text_of(t, k + j) for j, t in enumerate(lengths)]
        bodies.append(json.dumps({"model": model, "input": inputs}).encode())
        models.append(model)
    return Requests(name, bodies, models, list(workload.tokens), workload)


def cluster_rate(workload: Workload, cost: CostModel, slowdowns: Sequence[float]) -> float:
    """Requests/s the cluster sustains when every device forms full batches: offered
    load 1.0 (a device ``s`` times slower contributes ``1/s`` of one)."""
    one = capacity(workload, cost).requests_per_s
    return one * sum(1.0 / s for s in slowdowns)


@dataclass
class Outcome:
    latency_s: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    started: float = 0.0
    last_done: float = 0.0


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, due: float, out: Outcome
) -> None:
    try:
        async with session.post(
            url, data=body, headers={"content-type": "application/json"}
        ) as response:
            data = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        key = type(exc).__name__
        out.errors[key] = out.errors.get(key, 0) + 1
        return
    now = time.perf_counter()
    if status != 200:
        out.errors[str(status)] = out.errors.get(str(status), 0) + 1
        return
    out.latency_s.append(now - due)
    out.tokens += int(json.loads(data)["usage"]["prompt_tokens"])
    out.last_done = max(out.last_done, now)


async def open_loop(
    session: aiohttp.ClientSession,
    url: str,
    requests: Requests,
    rate: float,
    duration_s: float,
    offset: int = 0,
) -> dict[str, Any]:
    """Send requests at their arrival instants for ``duration_s``; wait for every answer."""
    times = requests.arrivals(rate)
    n = len(requests.bodies)
    out = Outcome(started=time.perf_counter())
    tasks: list[asyncio.Task[None]] = []
    k = 0
    while k < len(times) and times[k] < duration_s:
        due = out.started + times[k]
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        body = requests.bodies[(offset + k) % n]
        tasks.append(asyncio.create_task(_one(session, url, body, due, out)))
        k += 1
    sent_s = time.perf_counter() - out.started
    await asyncio.gather(*tasks)
    return summarize(out, k, max(duration_s, sent_s))


def summarize(out: Outcome, sent: int, span_s: float) -> dict[str, Any]:
    """Throughput over the sending span (answers that came later still count: an open
    loop run's throughput is what it served of what was offered), latency percentiles."""
    lat = np.asarray(out.latency_s) * 1e3 if out.latency_s else np.zeros(1)
    served_s = max(span_s, out.last_done - out.started) if out.latency_s else span_s
    return {
        "sent": sent,
        "ok": len(out.latency_s),
        "errors": out.errors,
        "error_share": (sent - len(out.latency_s)) / sent if sent else 0.0,
        "tokens": out.tokens,
        "tokens_per_s": out.tokens / served_s,
        "requests_per_s": len(out.latency_s) / served_s,
        "latency_ms": {q: float(np.percentile(lat, int(q[1:]))) for q in ("p50", "p90", "p99")},
        "served_s": served_s,
    }
