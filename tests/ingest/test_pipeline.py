"""The ingest core over the real in-process queue, worker (fake runtime) and qdrant-client
store: what is written, what is dead-lettered, and that outages delay but lose nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest

from embedder.codecs import RequestLimits
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from ingest.embedding import QueueEmbedder
from ingest.pipeline import Backoff, IngestCore, RawRecord
from ingest.records import RecordRules, SourceRef
from ingest.store import InvalidStoreRequest, Point, StoreUnavailable, point_id
from ingest.store.qdrant import QdrantStore
from tests.fakes import FakeLoader, fake_fleet


class FlakyStore(QdrantStore):
    """Refuses the first ``failures`` upserts as an unreachable server would."""

    def __init__(self, failures: int) -> None:
        super().__init__(location=":memory:")
        self.failures = failures
        self.refused = 0

    async def upsert(self, collection: str, points: Sequence[Point]) -> None:
        if self.refused < self.failures:
            self.refused += 1
            raise StoreUnavailable("connection refused")
        await super().upsert(collection, points)


class Stack:
    def __init__(self, core: IngestCore, loader: FakeLoader, store: QdrantStore) -> None:
        self.core = core
        self.loader = loader
        self.store = store
        self.dead: list[tuple[RawRecord, str]] = []

    async def dead_letter(self, poisons: Sequence[tuple[RawRecord, str]]) -> None:
        self.dead.extend(poisons)

    async def process(self, records: list[RawRecord]) -> Any:
        return await self.core.process(records, self.dead_letter)


async def make_stack(store: QdrantStore) -> AsyncIterator[Stack]:
    fleet = fake_fleet("mini", "other", max_tokens=16)
    queue = InProcessQueue()
    loader = FakeLoader()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", loader=loader)
    rules = RecordRules(
        default_collection="main",
        default_model="mini",
        max_text_bytes=10_000,
        resolve_model=lambda name: name if name in fleet.models else None,
    )
    core = IngestCore(
        QueueEmbedder(queue), store, rules, backoff=Backoff(first_s=0.01, deadline_s=5)
    )
    async with host:
        await host.wait_ready()
        yield Stack(core, loader, store)
    await store.close()


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async for s in make_stack(QdrantStore(location=":memory:")):
        yield s


def record(offset: int, key: str | None, value: object, **headers: str) -> RawRecord:
    """A record as Kafka hands it over: dicts as JSON, strings as plain text."""
    raw = json.dumps(value) if isinstance(value, dict) else value
    assert raw is None or isinstance(raw, (str, bytes))
    return RawRecord(
        key=key.encode() if key is not None else None,
        value=raw.encode() if isinstance(raw, str) else raw,
        headers=tuple((k.replace("_", "-"), v.encode()) for k, v in headers.items()),
        source=SourceRef("docs", 0, offset),
    )


async def stored(stack: Stack, collection: str, doc_ids: list[str]) -> dict[str, Point]:
    points = await stack.store.retrieve(collection, [point_id(collection, d) for d in doc_ids])
    return {p.payload["doc_id"]: p for p in points}


async def test_documents_are_embedded_and_stored_with_payload(stack: Stack) -> None:
    texts = {f"d{i}": f"document number {i} about law" for i in range(20)}
    records = [
        record(i, k, {"text": t, "metadata": {"n": i}}) for i, (k, t) in enumerate(texts.items())
    ]
    report = await stack.process(records)
    assert (report.upserted, report.dead_lettered) == (20, 0)
    assert await stack.store.count("main") == 20
    points = await stored(stack, "main", list(texts))
    runtime = stack.loader.runtimes["mini"]
    for i, (doc_id, text) in enumerate(texts.items()):
        point = points[doc_id]
        np.testing.assert_allclose(point.vector, runtime.expected_vector(text), atol=1e-5)
        assert point.payload["text"] == text
        assert point.payload["metadata"] == {"n": i}
        assert point.payload["model"] == "mini"
        assert point.payload["source"] == {"topic": "docs", "partition": 0, "offset": i}


async def test_replaying_a_chunk_duplicates_nothing(stack: Stack) -> None:
    records = [record(i, f"d{i}", f"text {i}") for i in range(10)]
    await stack.process(records)
    await stack.process(records)  # a crash before the commit redelivers the chunk
    assert await stack.store.count("main") == 10


async def test_delete_after_upsert_wins_and_upsert_after_delete_restores(stack: Stack) -> None:
    await stack.process([record(0, "keep", "v0"), record(1, "gone", "v0")])
    await stack.process(
        [
            record(2, "gone", "v1"),
            record(3, "gone", None),  # tombstone after an upsert in the same chunk
            record(4, "keep", None),
            record(5, "keep", "v2"),  # upsert after a tombstone
        ]
    )
    points = await stored(stack, "main", ["keep", "gone"])
    assert set(points) == {"keep"}
    assert points["keep"].payload["text"] == "v2"


async def test_poison_is_dead_lettered_and_its_neighbours_stored(stack: Stack) -> None:
    records = [
        record(0, "ok1", "fine"),
        record(1, "bad-json", b'{"text": '),
        record(2, "bad-utf8", b"\xff\xfe"),
        record(3, "empty", {"text": ""}),
        record(4, "long", " ".join(["word"] * 40)),  # over the fake model's 16 tokens
        record(5, "who", {"text": "t", "model": "nope"}),
        record(6, "ok2", "also fine"),
    ]
    report = await stack.process(records)
    assert report.upserted == 2
    reasons = {r.key: reason for r, reason in stack.dead}
    assert set(reasons) == {b"bad-json", b"bad-utf8", b"empty", b"long", b"who"}
    assert "16" in reasons[b"long"] and "tokens" in reasons[b"long"]
    assert "unknown model 'nope'" in reasons[b"who"]
    assert [r.value for r, _ in stack.dead if r.key == b"bad-utf8"] == [b"\xff\xfe"]
    assert set(await stored(stack, "main", ["ok1", "ok2"])) == {"ok1", "ok2"}


async def test_a_model_change_for_a_collection_is_refused(stack: Stack) -> None:
    await stack.process([record(0, "a", "first")])
    await stack.process([record(1, "b", {"text": "second", "model": "other"})])
    ((dead, why),) = stack.dead
    assert dead.key == b"b"
    assert "re-embed into a new collection" in why
    assert await stack.store.count("main") == 1


async def test_store_outage_delays_but_loses_nothing() -> None:
    async for stack in make_stack(FlakyStore(failures=3)):
        records = [record(i, f"d{i}", f"text {i}") for i in range(5)]
        report = await stack.process(records)  # returns only once the store confirmed
        assert report.upserted == 5
        assert isinstance(stack.store, FlakyStore) and stack.store.refused == 3
        assert await stack.store.count("main") == 5


async def test_store_outage_beyond_the_deadline_raises_and_writes_nothing() -> None:
    async for stack in make_stack(FlakyStore(failures=10_000)):
        stack.core.backoff = Backoff(first_s=0.01, max_s=0.02, deadline_s=0.2)
        with pytest.raises(StoreUnavailable):
            await stack.process([record(0, "d", "text")])  # the caller must not commit


class PickyStore(QdrantStore):
    """Refuses for good (a non-retriable store error) any batch holding a point whose
    metadata says ``refuse``, as a store does with a payload it cannot hold."""

    def __init__(self) -> None:
        super().__init__(location=":memory:")
        self.batches = 0

    async def upsert(self, collection: str, points: Sequence[Point]) -> None:
        self.batches += 1
        if any(p.payload["metadata"].get("refuse") for p in points):
            raise InvalidStoreRequest("payload not storable")
        await super().upsert(collection, points)


async def test_points_the_store_refuses_are_dead_lettered_alone() -> None:
    async for stack in make_stack(PickyStore()):
        refused = {3, 17, 18}
        records = [
            record(i, f"d{i}", {"text": f"text {i}", "metadata": {"refuse": i in refused}})
            for i in range(32)
        ]
        report = await stack.process(records)
        assert (report.upserted, report.dead_lettered) == (29, 3)
        assert report.reasons == {"store_refused": 3}
        assert sorted(r.source.offset for r, _ in stack.dead) == sorted(refused)
        assert all("payload not storable" in why for _, why in stack.dead)
        assert await stack.store.count("main") == 29


async def test_every_failure_of_one_record_is_counted_by_its_code(stack: Stack) -> None:
    records = [
        record(0, "ok", "fine"),
        record(1, "deep", b'{"text": "t", "metadata": {"a": ' + b"[" * 3000 + b"]" * 3000 + b"}}"),
        record(2, "json", b'{"text": '),
        record(3, "long", " ".join(["word"] * 40)),  # over the fake model's 16 tokens
        record(4, "where", {"text": "t", "collection": "no/slashes"}),
        RawRecord(b"hdr", b"text", (("flotilla-model", b"\xff"),), SourceRef("docs", 0, 5)),
    ]
    report = await stack.process(records)
    assert report.upserted == 1
    assert report.reasons == {
        "too_deep": 1,
        "bad_json": 1,
        "embedding_failed": 1,
        "bad_collection": 1,
        "bad_header": 1,
    }


async def test_a_collection_the_store_refuses_dead_letters_its_records() -> None:
    class NoNewCollections(QdrantStore):
        async def ensure_collection(self, name: str, *args: Any, **kw: Any) -> None:
            if name == "locked":
                raise InvalidStoreRequest("collection creation is not allowed here")
            await super().ensure_collection(name, *args, **kw)

    async for stack in make_stack(NoNewCollections(location=":memory:")):
        report = await stack.process(
            [record(0, "a", {"text": "t", "collection": "locked"}), record(1, "b", "fine")]
        )
        assert (report.upserted, report.dead_lettered) == (1, 1)
        assert "not allowed" in stack.dead[0][1]
