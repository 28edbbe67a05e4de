"""Ingest workers as separate processes, one killed with SIGKILL mid-stream and
restarted: the collection still ends with exactly the documents, vectors correct.

The workers are real `flotilla ingest` processes sharing one store through the
store server (an embedded shard has one owner), consuming a 4-partition topic on
the real broker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from embedder.fleet import load_fleet
from ingest.store.qdrant import QdrantStore
from tests.gateway.conftest import hub_offline
from tests.ingest.kafka_helpers import committed_lag, create_topic, produce
from tests.ingest.store.server_fixture import free_port, start_store_server, stop, wait_ready
from tests.ingest.test_kafka_ingest import (
    COLLECTION,
    documents,
    expected_vectors,
    stored_points,
)
from tests.kafka.broker import KafkaBroker
from tests.kafka.fixtures import unique_name
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow

DOCS = 10_000


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-crash")
    with hub_offline():
        return tiny_fleet_file(folder, build_tiny_embedder(folder))


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = tmp_path / "store.log"
    proc = start_store_server(tmp_path / "store", port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log)
        yield url
    finally:
        stop(proc)


class Worker:
    """One `flotilla ingest` process; its output goes to a log file."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flotilla", "ingest", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


async def wait_for(
    check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, workers: list[Worker]
) -> None:
    """Poll ``check``; fail early if a worker dies on its own, with its log."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        for worker in workers:
            if worker.proc.poll() not in (None, -signal.SIGKILL):
                raise AssertionError(f"a worker exited: {worker.log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            logs = "\n---\n".join(w.log.read_text()[-2000:] for w in workers)
            raise AssertionError(f"timed out waiting for {what}:\n{logs}")
        await asyncio.sleep(0.5)


async def test_kill_9_mid_stream_loses_and_duplicates_nothing(
    kafka_broker: KafkaBroker, fleet_file: Path, store_url: str, tmp_path: Path
) -> None:
    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("crash"), unique_name("g")
    await create_topic(bootstrap, topic, 4)
    docs = documents(DOCS)
    await produce(bootstrap, topic, [(d.encode(), t.encode()) for d, t in docs])
    args = [
        "--kafka", bootstrap, "--topic", topic, "--group", group,
        "--store", "qdrant", "--qdrant-url", store_url, "--fleet", str(fleet_file),
        "--collection", COLLECTION, "--device", "cpu", "--threads", "1",
        "--ingest-max-records", "200",
    ]  # fmt: skip
    store = QdrantStore(url=store_url)
    workers = [Worker(args, tmp_path / f"worker-{i}.log") for i in range(2)]

    async def some_written() -> bool:
        try:
            return await store.count(COLLECTION) >= DOCS // 4
        except Exception:  # the collection appears with the first write
            return False

    await wait_for(some_written, 180, "a quarter of the documents", workers)
    workers[0].kill()  # SIGKILL: no drain, no commit
    written_at_kill = await store.count(COLLECTION)
    assert written_at_kill < DOCS, "the stream ended before the kill; make it longer"
    workers.append(Worker(args, tmp_path / "worker-restarted.log"))

    async def drained() -> bool:
        return await committed_lag(bootstrap, topic, group, 4) == 0

    await wait_for(drained, 300, "every record to be committed", workers)
    for worker in workers[1:]:
        assert worker.stop() == 0, worker.log.read_text()[-3000:]

    assert await store.count(COLLECTION) == DOCS
    points = await stored_points(store, [d for d, _ in docs])
    assert sorted(p.payload["doc_id"] for p in points) == sorted(d for d, _ in docs)
    with hub_offline():
        want = expected_vectors(load_fleet(fleet_file), [t for _, t in docs])
    index = {d: i for i, (d, _) in enumerate(docs)}
    got = np.stack([np.asarray(p.vector) for p in points])
    cosine = (got * want[[index[p.payload["doc_id"]] for p in points]]).sum(axis=1)
    assert cosine.min() >= 0.9999, cosine.min()
    await store.close()
