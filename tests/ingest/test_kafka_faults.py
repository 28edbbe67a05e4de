"""Kafka ingest faults against the real broker: a missing dead-letter topic (created, or
a clear failure at start when creation is forbidden), poison of every shape among 1,000
good records (exactly the good ones stored, each bad one dead-lettered once), the broker
stopped and restarted mid-stream (exactly N stored), and a failed loop restarted by its
supervisor, inside `flotilla serve` too, with /ready and /metrics saying so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiokafka.producer.message_accumulator as accumulator
import aiokafka.producer.producer as producing
import httpx
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.fleet import load_fleet
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from flotilla.serve import build_app
from flotilla.settings import Settings
from ingest.dead_letters import ERROR_HEADER, TRUNCATED_HEADER, TRUNCATED_VALUE_BYTES, dlq_topic
from ingest.embedding import QueueEmbedder
from ingest.kafka_source import KafkaSource, TopicMissing
from ingest.pipeline import Backoff, IngestCore, RawRecord
from ingest.records import RecordRules, SourceRef
from ingest.store import Point, VectorStore, point_id
from ingest.store.qdrant import QdrantStore
from ingest.supervisor import IngestSupervisor, RestartPolicy
from tests.gateway.conftest import hub_offline
from tests.ingest.kafka_helpers import committed_lag, create_topic, produce, read_all, until
from tests.kafka.broker import KafkaBroker
from tests.kafka.fixtures import unique_name
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow

COLLECTION = "docs"
MAX_TEXT_BYTES = 10_000
QUICK = RestartPolicy(first_s=0.2, max_s=1.0)


@pytest.fixture(scope="module")
def tiny_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-faults")
    with hub_offline():
        return tiny_fleet_file(folder, build_tiny_embedder(folder))


@pytest.fixture(autouse=True)
def offline() -> object:
    with hub_offline():
        yield


@contextlib.asynccontextmanager
async def ingesting(
    fleet_path: Path,
    bootstrap: str,
    topic: str,
    group: str,
    store: VectorStore,
    *,
    dlq_create: bool = True,
) -> AsyncIterator[IngestSupervisor]:
    """One supervised consumer-group member, as `flotilla serve` runs it."""
    fleet = load_fleet(fleet_path)
    queue = InProcessQueue()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", threads=1)
    rules = RecordRules(
        COLLECTION, "tiny", MAX_TEXT_BYTES, lambda n: n if n in fleet.models else None
    )
    async with host:
        await host.wait_ready()
        core = IngestCore(QueueEmbedder(queue), store, rules, backoff=Backoff(first_s=0.05))
        source = KafkaSource(
            core,
            bootstrap=bootstrap,
            topic=topic,
            group=group,
            max_records=200,
            dlq_create=dlq_create,
        )
        async with IngestSupervisor(source, policy=QUICK) as supervisor:
            yield supervisor


def good_documents(n: int, prefix: str = "doc") -> list[tuple[bytes, bytes]]:
    return [
        (f"{prefix}-{i}".encode(), json.dumps({"text": f"Document {i} of {prefix}."}).encode())
        for i in range(n)
    ]


async def drained(bootstrap: str, topic: str, group: str, partitions: int) -> bool:
    try:
        return await committed_lag(bootstrap, topic, group, partitions) == 0
    except Exception:  # the broker restarting
        return False


async def stored_ids(store: VectorStore, ids: Sequence[str]) -> set[str]:
    points: list[Point] = []
    for start in range(0, len(ids), 1000):
        chunk = [point_id(COLLECTION, d) for d in ids[start : start + 1000]]
        points.extend(await store.retrieve(COLLECTION, chunk))
    return {p.payload["doc_id"] for p in points}


async def topic_partitions(bootstrap: str, topic: str) -> int | None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if topic not in await admin.list_topics():
            return None
        (described,) = await admin.describe_topics([topic])
        return len(described["partitions"])
    finally:
        await admin.close()


# -- the dead-letter topic -------------------------------------------------------------


async def test_a_missing_dead_letter_topic_is_created_like_its_topic(
    kafka_broker: KafkaBroker, tiny_fleet: Path
) -> None:
    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("nodlq"), unique_name("g")
    await create_topic(bootstrap, topic, 3)
    await produce(bootstrap, topic, [(b"ok", b"a good one"), (b"bad", b"\xff\xfe")])
    store = QdrantStore(location=":memory:")
    async with ingesting(tiny_fleet, bootstrap, topic, group, store) as supervisor:
        await until(lambda: drained(bootstrap, topic, group, 3), 60, "the records")
        assert supervisor.status().restarts == 0
        # A tombstone without key (other clients can write one; aiokafka cannot send
        # one) is dead-lettered too.
        keyless = RawRecord(None, None, (), SourceRef(topic, 1, 5))
        await supervisor.source.dead_letter([(keyless, "a tombstone needs a key")])  # type: ignore[attr-defined]
    assert await topic_partitions(bootstrap, dlq_topic(topic)) == 3
    dead = await read_all(bootstrap, dlq_topic(topic), expected=2)
    assert sorted((m.key or b"", m.value) for m in dead) == [(b"", b""), (b"bad", b"\xff\xfe")]  # type: ignore[attr-defined]
    assert await store.count(COLLECTION) == 1
    await store.close()


async def test_a_missing_dead_letter_topic_with_creation_forbidden_fails_at_start(
    kafka_broker: KafkaBroker, tiny_fleet: Path
) -> None:
    bootstrap, topic = kafka_broker.bootstrap, unique_name("nodlq")
    await create_topic(bootstrap, topic, 2)
    source = KafkaSource(
        IngestCore(QueueEmbedder(InProcessQueue()), QdrantStore(location=":memory:"), RULES),
        bootstrap=bootstrap,
        topic=topic,
        group=unique_name("g"),
        dlq_create=False,
    )
    started = time.monotonic()
    with pytest.raises(TopicMissing) as failure:
        await source.start()
    assert time.monotonic() - started < 5
    message = failure.value.message
    assert f"the dead-letter topic '{topic}.dlq' does not exist" in message
    assert "kafka-topics.sh" in message and "--dlq-create" in message
    assert await topic_partitions(bootstrap, dlq_topic(topic)) is None  # nothing created


RULES = RecordRules(COLLECTION, "tiny", MAX_TEXT_BYTES, lambda n: n)


# -- poison of every shape -------------------------------------------------------------


class RawName(str):
    """A header key that encodes to bytes that are not UTF-8, as a Go producer may write."""

    def encode(self, *args: object, **kwargs: object) -> bytes:
        return b"\xff\xfetrace"


def nested(depth: int) -> bytes:
    return b'{"text": "deep", "metadata": {"a": ' + b"[" * depth + b"]" * depth + b"}}"


POISON: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], str]] = [
    # key, value, headers, what the reason says
    (b"deep-2kb", nested(1_000), [], "nests"),
    (b"deep-200kb", nested(100_000), [], "nests"),
    (b"deep-25", nested(25), [], "nests deeper than 20"),
    (b"long-text", json.dumps({"text": "word " * 4_000}).encode(), [], "over the limit"),
    (b"huge-record", b"x" * 1_040_000, [], "over the limit"),
    (b"not-utf8", b"\xff\xfe plain", [], "not valid UTF-8"),
    (b"\xff\xfe", b"a key that is not UTF-8", [], "key is not valid UTF-8"),
    (b"no-header-value", b"text", [("flotilla-collection", None)], "has no value"),
    (b"header-not-utf8", b"text", [("flotilla-model", b"\xff")], "not valid UTF-8"),
    (b"header-bad-name", b"text", [("flotilla-collection", b"../up")], "collection name"),
    (b"text-a-number", b'{"text": 5}', [], "Expected `str`"),
    (b"metadata-a-list", b'{"text": "t", "metadata": [1]}', [], "Expected `object`"),
    (b"id-a-number", b'{"id": 7, "text": "t"}', [], "Expected `str | null`"),
    (b"no-text", b'{"id": "no-text"}', [], "neither 'text' nor 'document'"),
    (b"cut-json", b'{"text": "unterminated', [], "not a valid document JSON"),
]


async def produce_poison(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, max_request_size=1_048_500
    )
    await producer.start()
    try:
        sends = [
            await producer.send(topic, key=key, value=value, headers=headers)
            for key, value, headers, _ in POISON
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def produce_raw_header_key(bootstrap: str, topic: str) -> None:
    """Three records in one batch on partition 0, the middle one with a header key the
    client cannot decode: aiokafka fails on the whole batch whenever it fetches it."""
    with pytest.MonkeyPatch.context() as patch:
        # The pure-Python builder calls str.encode, which RawName overrides.
        patch.setattr(accumulator, "DefaultRecordBatchBuilder", _DefaultRecordBatchBuilderPy)
        patch.setattr(producing, "DefaultRecordBatchBuilder", _DefaultRecordBatchBuilderPy)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=200)
        await producer.start()
        try:
            sends = [
                await producer.send(topic, key=b"batch-mate-1", value=b"stored", partition=0),
                await producer.send(
                    topic, key=b"raw-key", value=b"v", headers=[(RawName("x"), b"1")], partition=0
                ),
                await producer.send(topic, key=b"batch-mate-2", value=b"stored", partition=0),
            ]
            placed = await asyncio.gather(*sends)
        finally:
            await producer.stop()
    assert len({m.offset for m in placed}) == 3


async def test_poison_of_every_shape_among_a_thousand_good_records(
    kafka_broker: KafkaBroker, tiny_fleet: Path
) -> None:
    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("shapes"), unique_name("g")
    await create_topic(bootstrap, topic, 3)
    good = good_documents(1_000)
    await produce(bootstrap, topic, good[:500])
    await produce_poison(bootstrap, topic)
    await produce_raw_header_key(bootstrap, topic)
    await produce(bootstrap, topic, good[500:])
    good_ids = [k.decode() for k, _ in good] + ["batch-mate-1", "batch-mate-2"]
    bad = len(POISON) + 1

    store = QdrantStore(location=":memory:")
    async with ingesting(tiny_fleet, bootstrap, topic, group, store) as supervisor:
        await until(lambda: drained(bootstrap, topic, group, 3), 120, "every record")
        assert supervisor.status().restarts == 0  # nothing crashed, nothing restarted
        totals = supervisor.source.totals  # type: ignore[attr-defined]
        assert (totals.upserted, totals.dead_lettered) == (len(good_ids), bad)
        # One more than expected: waits out the timeout, so a duplicate would show.
        dead = await read_all(bootstrap, dlq_topic(topic), expected=bad + 1, timeout_s=3)
    assert await store.count(COLLECTION) == len(good_ids)
    assert await stored_ids(store, good_ids) == set(good_ids)
    await store.close()

    sources = [
        (int(h["flotilla-source-partition"]), int(h["flotilla-source-offset"]))
        for h in (dict(m.headers) for m in dead)  # type: ignore[attr-defined]
    ]
    assert len(set(sources)) == len(sources) == bad, "each bad record dead-lettered once"
    reasons = {m.key: dict(m.headers)[ERROR_HEADER].decode() for m in dead}  # type: ignore[attr-defined]
    for key, _, _, says in POISON:
        assert says in reasons[key], (key, reasons[key])
    assert "header key is not valid UTF-8" in reasons[b"raw-key"]
    (huge,) = [m for m in dead if m.key == b"huge-record"]  # type: ignore[attr-defined]
    assert dict(huge.headers)[TRUNCATED_HEADER] == b"1040000"
    assert huge.value == b"x" * TRUNCATED_VALUE_BYTES


# -- the broker goes away --------------------------------------------------------------


async def test_the_broker_stopped_and_restarted_mid_stream_loses_and_duplicates_nothing(
    tiny_fleet: Path,
) -> None:
    docs = good_documents(3_000)
    ids = [k.decode() for k, _ in docs]
    store = QdrantStore(location=":memory:")
    with KafkaBroker(heap_mb=384) as broker:  # its own: halting the shared one would hurt
        bootstrap, topic, group = broker.bootstrap, unique_name("outage"), unique_name("g")
        await create_topic(bootstrap, topic, 2)
        await produce(bootstrap, topic, docs)
        async with ingesting(tiny_fleet, bootstrap, topic, group, store) as supervisor:

            async def some_stored() -> bool:
                with contextlib.suppress(Exception):
                    return await store.count(COLLECTION) >= 300
                return False

            await until(some_stored, 60, "the first documents")
            broker.halt(kill=True)  # no clean shutdown: an outage, not a maintenance
            at_halt = await store.count(COLLECTION)
            await asyncio.sleep(1)
            broker.resume()
            assert broker.bootstrap == bootstrap
            await until(lambda: drained(bootstrap, topic, group, 2), 180, "every record")
            status = supervisor.status()
    assert at_halt < len(docs), "the stream ended before the outage; make it longer"
    assert await store.count(COLLECTION) == len(docs)
    assert await stored_ids(store, ids) == set(ids)
    assert status.state == "running", status
    await store.close()


# -- a failed loop restarts --------------------------------------------------------------


class StoreWithABug(QdrantStore):
    """Raises an unclassified error (a bug, not a store error) on one upsert."""

    def __init__(self, fail_on: int) -> None:
        super().__init__(location=":memory:")
        self.calls = 0
        self.fail_on = fail_on

    async def upsert(self, collection: str, points: Sequence[Point]) -> None:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("a bug met once")
        await super().upsert(collection, points)


async def test_a_failed_loop_is_restarted_and_loses_nothing(
    kafka_broker: KafkaBroker, tiny_fleet: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("bug"), unique_name("g")
    await create_topic(bootstrap, topic, 2)
    docs = good_documents(1_000)
    await produce(bootstrap, topic, docs)
    store = StoreWithABug(fail_on=3)
    with caplog.at_level(logging.ERROR, logger="ingest.supervisor"):
        async with ingesting(tiny_fleet, bootstrap, topic, group, store) as supervisor:
            await until(lambda: drained(bootstrap, topic, group, 2), 120, "every record")
            status = supervisor.status()
    assert (status.state, status.restarts) == ("running", 1)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "RuntimeError: a bug met once" in line and "restarting in" in line
    assert await store.count(COLLECTION) == len(docs)
    await store.close()


async def test_serve_restarts_its_ingest_and_says_so_in_ready_and_metrics(
    kafka_broker: KafkaBroker, tiny_fleet: Path, tmp_path: Path
) -> None:
    """Inside `flotilla serve`: the dead-letter topic missing with creation forbidden
    fails every start; /ready stays 200 for the API but says degraded and why, until the
    topic exists and the next restart consumes."""
    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("serve"), unique_name("g")
    await create_topic(bootstrap, topic, 1)
    await produce(bootstrap, topic, good_documents(20))
    settings = Settings(
        fleet=tiny_fleet, device="cpu", threads=1, data_dir=tmp_path / "data",
        kafka=bootstrap, topic=topic, group=group, collection=COLLECTION, dlq_create=False,
    )  # fmt: skip
    app = build_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://serve") as client,
    ):

        async def restarted() -> bool:
            body = (await client.get("/ready")).json()
            return body.get("ingest", {}).get("restarts", 0) >= 1

        await until(restarted, 60, "a failed start of ingest")
        ready = await client.get("/ready")
        assert ready.status_code == 200  # the API serves
        assert ready.json()["status"] == "degraded"
        assert ready.json()["ingest"]["state"] in ("restarting", "starting")
        assert "--dlq-create" in (ready.json()["ingest"]["last_error"] or "")
        assert (await client.get("/ready/ingest")).status_code == 503
        metrics = (await client.get("/metrics")).text
        assert f'flotilla_ingest_up{{topic="{topic}"}} 0.0' in metrics
        assert f'flotilla_ingest_restarts_total{{topic="{topic}"}}' in metrics

        await create_topic(bootstrap, dlq_topic(topic), 1)

        async def consuming() -> bool:
            return (await client.get("/ready/ingest")).status_code == 200

        await until(consuming, 30, "ingest to run once the topic exists")
        await until(lambda: drained(bootstrap, topic, group, 1), 60, "the documents")
        ready = await client.get("/ready")
        assert ready.json()["status"] == "ready"
        metrics = (await client.get("/metrics")).text
        assert f'flotilla_ingest_up{{topic="{topic}"}} 1.0' in metrics
