"""One `flotilla gateway` and two `flotilla worker` processes over the real broker; 1,000
mixed requests while one worker is killed with SIGKILL. Every request gets one answer:
the right vectors (the tiny model's own embedding of its inputs) or a clear 504. None
hangs, none is wrong."""

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
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from numpy.typing import NDArray
from prometheus_client.parser import text_string_to_metric_families

from embedder.fleet import load_fleet
from embedder.runtimes import load_runtime
from tests.gateway.conftest import hub_offline
from tests.kafka.broker import KafkaBroker
from tests.kafka.fixtures import unique_name
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow

REQUESTS = 1_000
CONCURRENCY = 32
KILL_AFTER = 250  # answers before one worker is killed
REQUEST_TIMEOUT_S = 15.0
MIN_COSINE = 0.9999
WORDS = [
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
    "from", "his", "her", "it", "an", "be", "this", "are", "or", "law", "court", "state",
    "money", "house", "water", "city", "river", "music", "paper", "school", "night", "light",
    "world", "green", "small", "large", "quick", "brown", "fox", "jumps", "over", "lazy",
    "dog", "rain", "summer", "winter", "book", "table",
]  # fmt: skip


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-multiprocess")
    with hub_offline():
        return tiny_fleet_file(folder, build_tiny_embedder(folder))


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
                self.proc.kill()
                self.proc.wait()
                return -1
        return self.proc.returncode

    def tail(self) -> str:
        return f"--- {self.log.name}\n{self.log.read_text(errors='replace')[-3000:]}"


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


async def test_kill_9_a_worker_under_load_every_request_answered_once_right_or_504(
    kafka_broker: KafkaBroker, fleet_file: Path, tmp_path: Path
) -> None:
    requests = mixed_requests()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    shared = [
        "--kafka", kafka_broker.bootstrap, "--fleet", str(fleet_file),
        "--request-topic", unique_name("requests"), "--request-partitions", "6",
        "--worker-group", unique_name("workers"), "--status-topic", unique_name("status"),
        "--log-level", "warning",
    ]  # fmt: skip
    with processes() as procs:
        cluster = start_cluster(procs, shared, port, 2, tmp_path)
        gateway, workers, worker_ports = cluster.gateway, cluster.workers, cluster.worker_ports
        # The reference vectors, computed while the workers load their models.
        want = await asyncio.to_thread(
            expected_vectors, fleet_file, [t for _, _, texts in requests for t in texts]
        )
        await wait_until_serving(url, 2, procs)

        statuses: Counter[int] = Counter()
        wrong: list[str] = []
        answered = 0
        killed_at: float | None = None
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(client: httpx.AsyncClient, route: str, body: dict[str, object],
                      texts: list[str]) -> None:  # fmt: skip
            nonlocal answered, killed_at
            async with gate:
                response = await client.post(route, json=body)
            statuses[response.status_code] += 1
            if response.status_code == 200:
                got = vectors_of(route, response.json())
                cosine = (got * np.stack([want[t] for t in texts])).sum(axis=1)
                if got.shape[0] != len(texts) or cosine.min() < MIN_COSINE:
                    wrong.append(f"{route} {texts[0][:20]!r}: {cosine}")
            elif response.status_code != 504:
                wrong.append(f"{route}: {response.status_code} {response.text[:200]}")
            answered += 1
            if answered == KILL_AFTER:
                workers[0].kill()  # SIGKILL: no drain, no commit, no goodbye
                killed_at = time.monotonic()

        started = time.monotonic()
        limits = httpx.Limits(max_connections=CONCURRENCY)
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S + 15)  # past the gateway's own deadline
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
            async with asyncio.timeout(110):
                await asyncio.gather(*(one(client, *r) for r in requests))
            took = time.monotonic() - started
            metrics = (await client.get("/metrics")).text
        dropped = sum(
            sample.value
            for family in text_string_to_metric_families(metrics)
            if family.name == "flotilla_kafka_replies"
            for sample in family.samples
            if sample.labels.get("outcome") == "dropped"
        )
        print(
            f"\n{REQUESTS} requests in {took:.1f} s: {statuses[200]} answered, {statuses[504]} "
            f"504; {dropped:.0f} duplicate or late replies dropped; worker killed "
            f"{killed_at - started if killed_at else float('nan'):.1f} s in"
        )
        assert killed_at is not None
        assert not wrong, wrong[:10]
        assert sum(statuses.values()) == REQUESTS
        assert statuses[200] >= REQUESTS // 2, statuses  # the survivor took over
        # The survivor's own port: ready, and its metrics count the work it did.
        survivor = f"http://127.0.0.1:{worker_ports[1]}"
        async with httpx.AsyncClient(base_url=survivor, timeout=5) as probe:
            assert (await probe.get("/ready")).status_code == 200
            worker_metrics = (await probe.get("/metrics")).text
        done = sum(
            sample.value
            for family in text_string_to_metric_families(worker_metrics)
            if family.name == "flotilla_jobs"
            for sample in family.samples
            if sample.name == "flotilla_jobs_total" and sample.labels.get("outcome") == "ok"
        )
        assert done > 0, "the surviving worker's /metrics counted no finished jobs"
        assert workers[1].stop() == 0, workers[1].tail()
        # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly.
        assert gateway.stop() in (0, -signal.SIGTERM), gateway.tail()
        assert "Traceback" not in gateway.log.read_text(), gateway.tail()
