"""Real `flotilla gateway` and `flotilla worker` processes for the multi-process tests: the
processes and their logs, 1,000 mixed requests, and the tiny model's own embedding of
their inputs to check every answer against."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from numpy.typing import NDArray
from prometheus_client.parser import text_string_to_metric_families

from embedder.tasks.embed.runtimes import load_runtime
from embedder.tasks.fleet import load_fleet
from tests.gateway.conftest import hub_offline
from tests.kafka.fixtures import unique_name

REQUESTS = 1_000
CONCURRENCY = 32
REQUEST_TIMEOUT_S = 15.0
MIN_COSINE = 0.9999
WORDS = [
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
    "from", "his", "her", "it", "an", "be", "this", "are", "or", "law", "court", "state",
    "money", "house", "water", "city", "river", "music", "paper", "school", "night", "light",
    "world", "green", "small", "large", "quick", "brown", "fox", "jumps", "over", "lazy",
    "dog", "rain", "summer", "winter", "book", "table",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Process:
    """One `flotilla <command>` process, its output in a log file."""

    def __init__(self, command: str, args: list[str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flotilla", command, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGUSR1)  # where it waits, into its log
                time.sleep(1.0)
                self.proc.kill()
                self.proc.wait()
                return -1
        return self.proc.returncode

    def tail(self) -> str:
        return f"--- {self.log.name}\n{self.log.read_text(errors='replace')[-6000:]}"


@contextlib.contextmanager
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    try:
        yield started
    finally:
        for p in started:
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()


@dataclass
class Cluster:
    gateway: Process
    workers: list[Process]
    worker_ports: list[int]  # each worker's own /metrics


def start_cluster(
    procs: list[Process], shared: list[str], port: int, n_workers: int, tmp_path: Path
) -> Cluster:
    """One gateway on ``port`` and ``n_workers`` workers (each with its own metrics
    port), all on the ``shared`` queue arguments; added to ``procs`` to be cleaned up."""
    gateway_args = [
        *shared, "--host", "127.0.0.1", "--port", str(port),
        "--reply-topic-prefix", unique_name("replies"), "--gateway-id", "gw",
        "--request-timeout-s", str(REQUEST_TIMEOUT_S),
    ]  # fmt: skip
    gateway = Process("gateway", gateway_args, tmp_path / "gateway.log")
    procs.append(gateway)
    worker_args = [*shared, "--device", "cpu", "--threads", "1"]
    ports = [free_port() for _ in range(n_workers)]
    workers = [
        Process("worker", [*worker_args, "--worker-port", str(ports[i])],
                tmp_path / f"worker-{i}.log")
        for i in range(n_workers)
    ]  # fmt: skip
    procs.extend(workers)
    return Cluster(gateway, workers, ports)


def mixed_requests(seed: int = 7) -> list[tuple[str, dict[str, object], list[str]]]:
    """(route, body, texts): OpenAI and TEI shapes, 1-8 inputs of 1-30 words."""
    rng = random.Random(seed)
    out: list[tuple[str, dict[str, object], list[str]]] = []
    for i in range(REQUESTS):
        texts = [
            f"r{i} " + " ".join(rng.choices(WORDS, k=rng.randint(1, 30)))
            for _ in range(rng.randint(1, 8))
        ]
        if rng.random() < 0.5:
            out.append(("/v1/embeddings", {"model": "tiny", "input": texts}, texts))
        else:
            out.append(("/embed", {"inputs": texts}, texts))
    return out


def unit(vectors: NDArray[np.float32]) -> NDArray[np.float32]:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def expected_vectors(fleet_file: Path, texts: list[str]) -> dict[str, NDArray[np.float32]]:
    with hub_offline():
        runtime = load_runtime(load_fleet(fleet_file).get("tiny"), "cpu", 2)
    found: dict[str, NDArray[np.float32]] = {}
    for start in range(0, len(texts), 64):
        chunk = texts[start : start + 64]
        vectors = unit(runtime.forward(runtime.tokenize(chunk, "right")))
        found.update(zip(chunk, vectors, strict=True))
    return found


def vectors_of(route: str, body: dict[str, object]) -> NDArray[np.float32]:
    if route == "/v1/embeddings":
        data = body["data"]
        assert isinstance(data, list)
        rows = [item["embedding"] for item in sorted(data, key=lambda item: item["index"])]
    else:
        rows = body  # type: ignore[assignment]
    return unit(np.asarray(rows, dtype=np.float32))


async def jobs_done(client: httpx.AsyncClient, port: int) -> float:
    """The jobs a worker answered well, from its own /metrics on ``port``."""
    text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "flotilla_jobs"
        for sample in family.samples
        if sample.name == "flotilla_jobs_total" and sample.labels.get("outcome") == "ok"
    )


async def wait_until_serving(url: str, workers: int, procs: list[Process]) -> None:
    deadline = time.monotonic() + 120
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            for p in procs:
                if p.proc.poll() is not None:
                    raise AssertionError(f"a process exited:\n{p.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                models = (await client.get(f"{url}/v1/models")).json()["data"]
                if models[0]["state"] == "ready" and models[0]["workers"] == workers:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(
                    "not serving within 120 s:\n" + "\n".join(p.tail() for p in procs)
                )
            await asyncio.sleep(0.25)
