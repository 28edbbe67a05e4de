"""One `flotilla worker --nats ... --kafka ... --topic ...` process ingests a backlog of
documents into a store server while online requests flow to it through a `flotilla
gateway` on the real nats-server: every document lands once, every online request is
answered right, and during the backlog each online request waits a few batches, not
for the backlog (online first); ingest keeps going under the steady online load. On
SIGTERM the worker drains, commits and exits 0. Stopped mid-backlog (in process, fake
models), a worker commits exactly what it stored, and a restart stores the rest once.
A collection of the embedded store that another process owns stops a worker at once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.services.kafka.broker import KafkaBroker
from bench.services.nats import NatsServer
from flotilla.distributed import build_gateway_app, run_worker
from flotilla.settings import Settings
from ingest.store import chunk_point_id
from ingest.store.edge import EdgeStore
from ingest.store.qdrant import QdrantStore
from tests.distributed.cluster import (
    MIN_COSINE,
    Process,
    expected_vectors,
    free_port,
    processes,
    vectors_of,
    wait_until_serving,
)
from tests.distributed.helpers import eventually
from tests.fakes import FakeLoader
from tests.gateway.conftest import hub_offline
from tests.ingest.kafka_helpers import committed_lag, create_topic, produce
from tests.kafka.fixtures import unique_name
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow

DOCUMENTS = 6_000
PARTITIONS = 2
CHUNK = 2_000  # records per ingest chunk: a third of the backlog is queued at once
ONLINE_EVERY_S = 0.05  # a steady open-loop online load, one request every 50 ms
COLLECTION = "docs"
WORDS = ["contract", "law", "tax", "rules", "shipping", "weather", "football", "poetry"]


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-worker-ingest")
    with hub_offline():
        return tiny_fleet_file(folder, build_tiny_embedder(folder))


def document(i: int) -> str:
    """About 50 tokens: most of the tiny model's 64-token window."""
    return f"Document {i}: " + " ".join(WORDS[(i * 7 + j) % 8] for j in range(40))


def online_texts(i: int) -> list[str]:
    return [f"online {i} {WORDS[i % 8]} {WORDS[(i + k) % 8]}" for k in range(1 + i % 3)]


def metric(text: str, sample_name: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def test_online_requests_go_first_while_a_backlog_is_ingested_once(
    kafka_broker: KafkaBroker,
    nats_server: NatsServer,
    fleet_file: Path,
    store_url: str,
    tmp_path: Path,
) -> None:
    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("docs"), unique_name("g")
    await create_topic(bootstrap, topic, PARTITIONS)
    docs = [(f"doc-{i}", document(i)) for i in range(DOCUMENTS)]
    await produce(bootstrap, topic, [(d.encode(), t.encode()) for d, t in docs])

    port, worker_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    stream = unique_name("JOBS").replace("-", "_")
    queue = [
        "--nats", nats_server.url, "--fleet", str(fleet_file), "--nats-stream", stream,
        "--nats-subject-prefix", f"jobs.{stream}", "--nats-storage", "memory",
        "--log-level", "warning",
    ]  # fmt: skip
    gateway_args = [
        *queue, "--host", "127.0.0.1", "--port", str(port), "--gateway-id", "gw",
        "--reply-topic-prefix", unique_name("replies"), "--request-timeout-s", "15",
    ]  # fmt: skip
    worker_args = [
        *queue, "--kafka", bootstrap, "--topic", topic, "--group", group,
        "--store", "qdrant", "--qdrant-url", store_url, "--collection", COLLECTION,
        "--ingest-max-records", str(CHUNK), "--device", "cpu", "--threads", "1",
        "--worker-port", str(worker_port),
    ]  # fmt: skip
    store = QdrantStore(url=store_url)

    async def stored() -> int:
        try:
            return await store.count(COLLECTION)
        except Exception:  # the collection appears with the first write
            return 0

    with processes() as procs:
        procs.append(Process("gateway", gateway_args, tmp_path / "gateway.log"))
        worker = Process("worker", worker_args, tmp_path / "worker.log")
        procs.append(worker)
        online = [t for i in range(400) for t in online_texts(i)]
        want = await asyncio.to_thread(expected_vectors, fleet_file, online)
        await wait_until_serving(url, 1, procs)

        # Online requests at a steady rate while the store fills; the count is sampled
        # to time the backlog.
        latencies: list[tuple[float, float]] = []  # (sent at, seconds to the answer)
        wrong: list[str] = []
        counts: list[tuple[float, int]] = []
        full = asyncio.Event()

        async def one(client: httpx.AsyncClient, i: int) -> None:
            texts = online_texts(i)
            sent = time.monotonic()
            response = await client.post("/v1/embeddings", json={"model": "tiny", "input": texts})
            latencies.append((sent, time.monotonic() - sent))
            if response.status_code != 200:
                wrong.append(f"{response.status_code} {response.text[:200]}")
                return
            got = vectors_of("/v1/embeddings", response.json())
            cosine = (got * np.stack([want[t] for t in texts])).sum(axis=1)
            if cosine.min() < MIN_COSINE:
                wrong.append(f"{texts}: {cosine}")

        async def online_load(client: httpx.AsyncClient) -> None:
            sending: list[asyncio.Task[None]] = []
            i = 0
            while not full.is_set() and i < 400:
                sending.append(asyncio.create_task(one(client, i)))
                i += 1
                await asyncio.sleep(ONLINE_EVERY_S)
            await asyncio.gather(*sending)

        async def watch_store() -> None:
            while (count := await stored()) < DOCUMENTS:
                counts.append((time.monotonic(), count))
                if worker.proc.poll() is not None:
                    raise AssertionError(f"the worker exited:\n{worker.tail()}")
                await asyncio.sleep(0.1)
            counts.append((time.monotonic(), count))
            full.set()

        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            async with asyncio.timeout(60):
                await asyncio.gather(online_load(client), watch_store())

        async def committed() -> bool:
            return await committed_lag(bootstrap, topic, group, PARTITIONS) == 0

        deadline = time.monotonic() + 15
        while not await committed():
            assert time.monotonic() < deadline, "the offsets were not all committed"
            await asyncio.sleep(0.25)
        # after the commits, which follow the counting: the store fills a moment before
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{worker_port}") as probe:
            ready = (await probe.get("/ready")).json()
            worker_metrics = (await probe.get("/metrics")).text
        assert worker.stop() == 0, worker.tail()
        assert "Traceback" not in worker.log.read_text(), worker.tail()

    # Every document once: the count is the number of documents, and each one's point is
    # there with its own text.
    assert await store.count(COLLECTION) == DOCUMENTS
    ids = [chunk_point_id(COLLECTION, d, 0) for d, _ in docs]
    points = []
    for start in range(0, DOCUMENTS, 2000):
        points.extend(await store.retrieve(COLLECTION, ids[start : start + 2000]))
    assert sorted(p.payload["doc_id"] for p in points) == sorted(d for d, _ in docs)
    assert all(p.payload["text"] == document(int(p.payload["doc_id"][4:])) for p in points)
    await store.close()

    # Every online request answered, right.
    assert not wrong, wrong[:5]
    assert len(latencies) >= 20

    # The backlog: from the first stored point to the last.
    began = next(t for t, c in counts if c > 0)
    ended = counts[-1][0]
    backlog_s = ended - began
    during = sorted(lat for sent, lat in latencies if began <= sent <= ended - 0.5)
    p90 = during[int(0.9 * (len(during) - 1))]
    progress = [c for t, c in counts if t >= began]
    print(
        f"\nbacklog of {DOCUMENTS} documents in {backlog_s:.1f} s; {len(during)} online "
        f"requests during it: p50 {during[len(during) // 2] * 1e3:.0f} ms, p90 "
        f"{p90 * 1e3:.0f} ms, max {during[-1] * 1e3:.0f} ms"
    )
    assert backlog_s >= 1.5, f"the backlog took {backlog_s:.1f} s: make it longer"
    assert len(during) >= 10, "too few online requests met the backlog"
    # Online first: a request waits a few batches, not for the chunk of the backlog queued
    # ahead of it (a third of the backlog is queued at once), let alone the backlog.
    # Measured: p90 3-4 % and max 5-8 % of the backlog; with the online jobs' deadlines
    # pushed behind the ingest jobs' (online last), p90 30 %.
    assert p90 < backlog_s / 10, (p90, backlog_s)
    assert during[-1] < backlog_s / 5, (during[-1], backlog_s)
    # Ingest went on under the steady online load: chunk after chunk was written while
    # online requests kept coming (the count rises a chunk at a time).
    first_sent, last_sent = latencies[0][0], max(sent for sent, _ in latencies)
    steps = [c for t, c in counts if first_sent <= t <= last_sent]
    assert len(set(steps)) >= 3, counts
    assert progress == sorted(progress)
    # The worker's own port covers ingest.
    assert ready["status"] == "ready" and ready["ingest"]["state"] == "running", ready
    assert metric(worker_metrics, "flotilla_ingest_up", topic=topic) == 1
    assert metric(worker_metrics, "flotilla_ingest_records_total", topic=topic) >= DOCUMENTS


async def test_an_embedded_collection_another_process_owns_fails_the_worker_at_once(
    tmp_path: Path,
) -> None:
    """The store owner rule: a worker opens its collection before it loads a model or
    connects anywhere, so one owned by another process ends it with the owner's name.
    The fleet's model does not exist and no server listens: only the claim is reached."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"models:\n  m:\n    source: {{path: {tmp_path / 'none'}}}\n")
    args = [
        "--nats", "nats://127.0.0.1:9", "--kafka", "127.0.0.1:9", "--topic", "docs",
        "--store", "edge", "--data-dir", str(tmp_path / "vectors"), "--collection", "docs",
        "--fleet", str(fleet),
    ]  # fmt: skip
    async with EdgeStore(tmp_path / "vectors") as owner:
        await owner.ensure_collection("docs", 4, "cosine", "m")
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "flotilla", "worker", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"is owned by process {os.getpid()}" in done.stderr, done.stderr[-2000:]
    assert "--store qdrant" in done.stderr and "Traceback" not in done.stderr


async def test_stopped_mid_backlog_it_commits_what_it_stored_and_a_restart_ends_it(
    kafka_broker: KafkaBroker, nats_server: NatsServer, store_url: str, tmp_path: Path
) -> None:
    """`run_worker` as `flotilla worker` runs it, with fake models that take a little time
    per token: the stop comes while documents are still being ingested and an online
    request is answered meanwhile. After the stop every committed record is stored and
    nothing stored is uncommitted (the chunk in flight was finished and committed)."""
    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("docs"), unique_name("g")
    await create_topic(bootstrap, topic, PARTITIONS)
    total = 2_000
    records = [(f"doc-{i}".encode(), document(i).encode()) for i in range(total)]
    await produce(bootstrap, topic, records)
    fleet = tmp_path / "fleet.yaml"
    profile = {"cpu": {"max_batch_tokens": 2048, "max_batch_requests": 64, "max_wait_ms": 1}}
    model = {"source": {"path": str(tmp_path)}, "max_tokens": 64, "profiles": profile}
    fleet.write_text(yaml.safe_dump({"models": {"alpha": model}}), encoding="utf-8")
    stream = unique_name("JOBS").replace("-", "_")
    settings = Settings(
        nats=nats_server.url, nats_stream=stream, nats_subject_prefix=f"jobs.{stream}",
        nats_storage="memory", reply_topic_prefix=unique_name("replies"), gateway_id="gw",
        kafka=bootstrap, topic=topic, group=group, store="qdrant", qdrant_url=store_url,
        collection=COLLECTION, ingest_max_records=200, fleet=fleet, device="cpu",
    )  # fmt: skip
    store = QdrantStore(url=store_url)

    async def stored() -> int:
        try:
            return await store.count(COLLECTION)
        except Exception:
            return 0

    async def lag() -> int:
        return await committed_lag(bootstrap, topic, group, PARTITIONS)

    # About 2.5 ms per document of ~45 tokens: the backlog lasts about 5 s.
    loader = FakeLoader(seconds_per_token=5e-5)
    app = build_gateway_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as gw,
    ):
        stop = asyncio.Event()
        running = asyncio.create_task(run_worker(settings, stop, loader=loader))
        try:
            await eventually(lambda: _more_than(stored, 400), "some chunks stored", 30)
            answer = await gw.post("/v1/embeddings", json={"model": "alpha", "input": "online"})
            assert answer.status_code == 200, answer.text
        finally:
            stop.set()
            async with asyncio.timeout(30):
                await running
        left, written = await lag(), await stored()
        assert 0 < written < total, "the backlog ended before the stop: make it longer"
        assert written == total - left  # committed == stored: drained, then committed

        stop = asyncio.Event()
        running = asyncio.create_task(run_worker(settings, stop, loader=loader))
        try:
            await eventually(lambda: _equals(lag, 0), "the rest committed", 60)
        finally:
            stop.set()
            async with asyncio.timeout(30):
                await running
    assert await store.count(COLLECTION) == total
    await store.close()


async def _more_than(count: Callable[[], Awaitable[int]], n: int) -> bool:
    return await count() > n


async def _equals(count: Callable[[], Awaitable[int]], n: int) -> bool:
    return await count() == n
