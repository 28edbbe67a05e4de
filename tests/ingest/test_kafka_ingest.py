"""Kafka ingestion into the store against the real broker: exactly the documents,
poison to the dead-letter topic, tombstones, and store outages (a store that refuses
writes, and the Qdrant server itself killed mid-stream and started again).

The model is a tiny random-weight BERT built here (plumbing, not quality); stored
vectors are compared with the same model's direct embedding of each text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bench.services.kafka.broker import KafkaBroker
from embedder.core.fleet import Fleet
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.runtimes import load_runtime
from embedder.tasks.fleet import load_fleet
from ingest.embedding import QueueEmbedder
from ingest.kafka_source import ERROR_HEADER, KafkaSource, dlq_topic
from ingest.pipeline import Backoff, IngestCore
from ingest.records import RecordRules
from ingest.store import CollectionNotFound, Point, StoreUnavailable, VectorStore, point_id
from ingest.store.qdrant import QdrantStore
from ingest.supervisor import STORE_UP, UP, IngestSupervisor, RestartPolicy
from tests.gateway.conftest import hub_offline
from tests.ingest.kafka_helpers import (
    committed_lag,
    create_topic,
    produce,
    read_all,
    topic_size,
    until,
)
from tests.ingest.store.server_fixture import free_port, start_store_server, stop, wait_ready
from tests.kafka.fixtures import unique_name
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow

COLLECTION = "docs"
QUICK = RestartPolicy(first_s=0.2, max_s=1.0)
FAST = Backoff(first_s=0.05)


@pytest.fixture(scope="module")
def tiny_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    with hub_offline():
        return tiny_fleet_file(folder, build_tiny_embedder(folder))


@pytest.fixture(autouse=True)
def offline() -> object:
    with hub_offline():
        yield


def expected_vectors(fleet: Fleet, texts: Sequence[str]) -> np.ndarray:
    """The tiny model's own embedding of each text, unit length."""
    runtime = load_runtime(fleet.get("tiny"), "cpu", 2)
    vectors = runtime.forward(runtime.tokenize(list(texts), "right"))
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@dataclass
class Members:
    sources: list[KafkaSource]
    store: VectorStore
    fleet: Fleet
    supervisors: list[IngestSupervisor]  # one per source, when supervised


@contextlib.asynccontextmanager
async def members(
    fleet_path: Path,
    bootstrap: str,
    topic: str,
    group: str,
    count: int,
    store: VectorStore,
    *,
    backoff: Backoff = FAST,
    supervised: bool = False,
) -> AsyncIterator[Members]:
    """``count`` consumer-group members sharing one model host, queue and store; each run
    by an ``IngestSupervisor`` (as `flotilla serve` runs it) if ``supervised``."""
    fleet = load_fleet(fleet_path)
    queue = InProcessQueue()
    host = ModelHost(fleet, queue, options=[RequestLimits()], device="cpu", threads=2)
    rules = RecordRules(COLLECTION, "tiny", 10_000, lambda n: n if n in fleet.models else None)
    async with host:
        await host.wait_ready()
        cores = [
            IngestCore(QueueEmbedder(queue), store, rules, backoff=backoff) for _ in range(count)
        ]
        sources = [
            KafkaSource(core, bootstrap=bootstrap, topic=topic, group=group, max_records=256)
            for core in cores
        ]
        supervisors = [
            IngestSupervisor(source, policy=QUICK, store=core.store_watch)
            for source, core in zip(sources, cores, strict=True)
        ]
        running: Sequence[KafkaSource | IngestSupervisor] = supervisors if supervised else sources
        for each in running:
            await each.start()
        try:
            yield Members(sources, store, fleet, supervisors if supervised else [])
        finally:
            for each in running:
                await each.stop()


def documents(n: int) -> list[tuple[str, str]]:
    topics = ["contract law", "tax rules", "shipping", "weather", "football", "poetry"]
    return [
        (f"doc-{i}", f"Document {i} is about {topics[i % 6]} and item {i * 7 % 101}.")
        for i in range(n)
    ]


async def stored_points(store: VectorStore, ids: Sequence[str]) -> list[Point]:
    points: list[Point] = []
    for start in range(0, len(ids), 1000):
        chunk = [point_id(COLLECTION, d) for d in ids[start : start + 1000]]
        points.extend(await store.retrieve(COLLECTION, chunk))
    return points


async def test_ten_thousand_documents_two_members(
    kafka_broker: KafkaBroker, tiny_fleet: Path
) -> None:
    bootstrap, group = kafka_broker.bootstrap, unique_name("g")
    topic = await new_topic(bootstrap, "docs", 4)
    docs = documents(10_000)
    store = QdrantStore(location=":memory:")
    async with members(tiny_fleet, bootstrap, topic, group, 2, store) as m:

        async def both_assigned() -> bool:
            return all(s.consumer.assignment() for s in m.sources)

        # Produce once the group has settled, or the first member to join may take
        # the whole stream before the second arrives (the tiny model is fast).
        await until(both_assigned, 60, "both members to hold partitions")
        await produce(
            bootstrap, topic, [(d.encode(), json.dumps({"text": t}).encode()) for d, t in docs]
        )
        await until(
            lambda: _drained(bootstrap, topic, group), 240, "the group to commit every record"
        )
        per_member = [s.totals.upserted for s in m.sources]
    assert all(n > 0 for n in per_member), per_member  # both members took partitions
    assert sum(per_member) >= 10_000  # replays after a rebalance may write a point twice
    assert await store.count(COLLECTION) == 10_000
    points = await stored_points(store, [d for d, _ in docs])
    assert sorted(p.payload["doc_id"] for p in points) == sorted(d for d, _ in docs)
    want = expected_vectors(m.fleet, [t for _, t in docs])
    index = {d: i for i, (d, _) in enumerate(docs)}
    got = np.stack([np.asarray(p.vector) for p in points])
    rows = [index[p.payload["doc_id"]] for p in points]
    cosine = (got * want[rows]).sum(axis=1)
    assert cosine.min() >= 0.9999, cosine.min()
    await store.close()


async def _drained(bootstrap: str, topic: str, group: str) -> bool:
    return await committed_lag(bootstrap, topic, group, PARTITIONS[topic]) == 0


PARTITIONS: dict[str, int] = {}


async def new_topic(bootstrap: str, prefix: str, partitions: int) -> str:
    topic = unique_name(prefix)
    await create_topic(bootstrap, topic, partitions)
    PARTITIONS[topic] = partitions
    return topic


async def test_poison_goes_to_the_dead_letter_topic(
    kafka_broker: KafkaBroker, tiny_fleet: Path
) -> None:
    bootstrap, group = kafka_broker.bootstrap, unique_name("g")
    topic = await new_topic(bootstrap, "poison", 2)
    await create_topic(bootstrap, dlq_topic(topic), 1)
    records: list[tuple[bytes | None, bytes | None]] = [
        (b"good-1", b'{"text": "a fine document"}'),
        (b"bad-json", b'{"text": "no end'),
        (b"bad-utf8", b"\xff\xfe\xfd"),
        (b"empty", b'{"text": ""}'),
        (b"oversize", json.dumps({"text": "word " * 200}).encode()),  # over 64 tokens
        (b"unknown-model", b'{"text": "t", "model": "no-such-model"}'),
        (b"good-2", b"plain text is a document too"),
    ]
    await produce(bootstrap, topic, records)
    store = QdrantStore(location=":memory:")
    async with members(tiny_fleet, bootstrap, topic, group, 1, store):
        await until(lambda: _drained(bootstrap, topic, group), 60, "the records to be committed")
        dead = await read_all(bootstrap, dlq_topic(topic), expected=5)
    by_key = {m.key: m for m in dead}  # type: ignore[attr-defined]
    assert set(by_key) == {b"bad-json", b"bad-utf8", b"empty", b"oversize", b"unknown-model"}
    for key, value in records:
        if key in by_key:
            message = by_key[key]
            assert message.value == value  # type: ignore[attr-defined]
            headers = dict(message.headers)  # type: ignore[attr-defined]
            assert headers["flotilla-source-topic"] == topic.encode()
            assert int(headers["flotilla-source-offset"]) >= 0
    reasons = {k: dict(m.headers)[ERROR_HEADER].decode() for k, m in by_key.items()}  # type: ignore[attr-defined]
    assert "JSON" in reasons[b"bad-json"]
    assert "UTF-8" in reasons[b"bad-utf8"]
    assert "empty" in reasons[b"empty"]
    assert "64" in reasons[b"oversize"]
    assert "no-such-model" in reasons[b"unknown-model"]
    got = await store.retrieve(
        COLLECTION, [point_id(COLLECTION, "good-1"), point_id(COLLECTION, "good-2")]
    )
    assert {p.payload["doc_id"] for p in got} == {"good-1", "good-2"}
    await store.close()


async def test_tombstones_delete_and_the_last_write_wins(
    kafka_broker: KafkaBroker, tiny_fleet: Path
) -> None:
    bootstrap, group = kafka_broker.bootstrap, unique_name("g")
    topic = await new_topic(bootstrap, "tomb", 2)
    await produce(
        bootstrap,
        topic,
        [
            (b"a", b"first version of a"),
            (b"b", b"only version of b"),
            (b"c", b"c before its deletion"),
            (b"a", b"second version of a"),
            (b"c", None),  # tombstone after an upsert of the same key
            (b"d", None),  # tombstone for a document never written
        ],
    )
    store = QdrantStore(location=":memory:")
    async with members(tiny_fleet, bootstrap, topic, group, 1, store):
        await until(lambda: _drained(bootstrap, topic, group), 60, "the records to be committed")
        points = await store.retrieve(COLLECTION, [point_id(COLLECTION, k) for k in "abcd"])
        assert {p.payload["doc_id"]: p.payload["text"] for p in points} == {
            "a": "second version of a",
            "b": "only version of b",
        }
        await produce(bootstrap, topic, [(b"a", None)])  # a later tombstone, a later chunk
        await until(lambda: _drained(bootstrap, topic, group), 60, "the tombstone")
        assert await store.count(COLLECTION) == 1
    await store.close()


class OutageStore(QdrantStore):
    """Raises StoreUnavailable on every write until ``healthy`` is set."""

    def __init__(self) -> None:
        super().__init__(location=":memory:")
        self.healthy = asyncio.Event()
        self.refused = 0

    async def upsert(self, collection: str, points: Sequence[Point]) -> None:
        if not self.healthy.is_set():
            self.refused += 1
            raise StoreUnavailable("store down")
        await super().upsert(collection, points)


async def test_store_outage_commits_nothing_and_loses_nothing(
    kafka_broker: KafkaBroker, tiny_fleet: Path
) -> None:
    bootstrap, group = kafka_broker.bootstrap, unique_name("g")
    topic = await new_topic(bootstrap, "outage", 2)
    docs = documents(300)
    await produce(bootstrap, topic, [(d.encode(), t.encode()) for d, t in docs])
    store = OutageStore()
    async with members(tiny_fleet, bootstrap, topic, group, 1, store):
        await until(lambda: _refused_twice(store), 60, "the store to refuse writes")
        await asyncio.sleep(1.0)
        assert await committed_lag(bootstrap, topic, group, 2) == 300  # nothing committed
        store.healthy.set()
        await until(lambda: _drained(bootstrap, topic, group), 60, "recovery")
        assert await store.count(COLLECTION) == 300
    await store.close()


async def _refused_twice(store: OutageStore) -> bool:
    return store.refused >= 2


async def test_a_qdrant_server_outage_pauses_ingest_and_loses_nothing(
    kafka_broker: KafkaBroker, tiny_fleet: Path, tmp_path: Path
) -> None:
    """The real thing: the Qdrant server (the store server, through qdrant-client) is
    killed mid-stream, its port refusing connections for a few seconds, then started
    again on the same port and data. Meanwhile ingest reports that it waits on the store
    and commits nothing; then it resumes by itself, and every document is stored exactly
    once with its own vector: none skipped, none dead-lettered."""
    bootstrap, group = kafka_broker.bootstrap, unique_name("g")
    topic = await new_topic(bootstrap, "qdrant-outage", 2)
    docs = documents(900)
    data_dir, log, port = tmp_path / "vectors", tmp_path / "store.log", free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_store_server(data_dir, port, log)
    await asyncio.to_thread(wait_ready, url, server, log)
    store = QdrantStore(url=url, timeout_s=2)
    quick = Backoff(first_s=0.05, max_s=0.5, deadline_s=30)
    try:
        async with members(
            tiny_fleet, bootstrap, topic, group, 1, store, backoff=quick, supervised=True
        ) as m:
            (supervisor,) = m.supervisors
            # A stream: batches of 30 documents, 0.15 s apart, the server killed in between.
            stream = asyncio.create_task(produce_slowly(bootstrap, topic, docs, 30, 0.15))
            await until(lambda: stored_at_least(store, 150), 60, "the first documents stored")
            server.kill()  # the harshest stop: writes in flight get no answer
            await asyncio.to_thread(server.wait, 30)
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()

            await until(lambda: is_waiting(supervisor), 30, "ingest to report the outage")
            status = supervisor.status()
            assert not status.up and status.restarts == 0
            assert "unreachable: ConnectError" in (status.last_error or "")
            assert (STORE_UP.labels(topic)._value.get(), UP.labels(topic)._value.get()) == (0, 0)
            await stream
            behind = await committed_lag(bootstrap, topic, group, 2)
            await asyncio.sleep(3)  # down a few seconds more: nothing moves
            assert await committed_lag(bootstrap, topic, group, 2) == behind > 0
            assert supervisor.status().state == "waiting"

            server = start_store_server(data_dir, port, log)  # same data, same address
            await asyncio.to_thread(wait_ready, url, server, log)
            await until(lambda: _drained(bootstrap, topic, group), 60, "ingest to resume")
            status = supervisor.status()
            assert (status.state, status.restarts, status.last_error) == ("running", 0, None)
            assert STORE_UP.labels(topic)._value.get() == 1
            assert m.sources[0].totals.dead_lettered == 0
        assert await topic_size(bootstrap, dlq_topic(topic)) == 0
        assert await store.count(COLLECTION) == len(docs)  # each id once
        points = await stored_points(store, [d for d, _ in docs])
        assert [p.payload["doc_id"] for p in points] == [d for d, _ in docs]
        want = expected_vectors(m.fleet, [t for _, t in docs])
        cosine = (np.stack([np.asarray(p.vector) for p in points]) * want).sum(axis=1)
        assert cosine.min() >= 0.9999, cosine.min()
    finally:
        await store.close()
        stop(server)


async def produce_slowly(
    bootstrap: str, topic: str, docs: list[tuple[str, str]], batch: int, pause_s: float
) -> None:
    for start in range(0, len(docs), batch):
        chunk = docs[start : start + batch]
        await produce(bootstrap, topic, [(d.encode(), t.encode()) for d, t in chunk])
        await asyncio.sleep(pause_s)


async def stored_at_least(store: VectorStore, n: int) -> bool:
    try:
        return await store.count(COLLECTION) >= n
    except CollectionNotFound:  # not before the first write
        return False


async def is_waiting(supervisor: IngestSupervisor) -> bool:
    return supervisor.status().state == "waiting"
