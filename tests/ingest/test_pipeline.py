"""The ingest core over the real in-process queue, worker (fake runtime) and qdrant-client
store: what is written, what is dead-lettered, that outages delay but lose nothing, and
how long documents become passages that replacing and deleting keep exact."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest

from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.engine import LoadedEncoders
from embedder.tasks.registry import encoder_loaders
from ingest.chunking import Chunking
from ingest.embedding import QueueEmbedder, model_windows
from ingest.pipeline import Backoff, IngestCore, RawRecord
from ingest.records import RecordRules, SourceRef
from ingest.store import (
    InvalidStoreRequest,
    PayloadFilter,
    Point,
    StoreMisconfigured,
    StoreUnavailable,
    chunk_point_id,
    point_id,
)
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


async def make_stack(store: QdrantStore, *, chunking: bool = True) -> AsyncIterator[Stack]:
    """The fake models take 16 tokens: 14 words and the two special tokens."""
    fleet = fake_fleet("mini", "other", max_tokens=16)
    queue = InProcessQueue()
    loader = FakeLoader()
    host = ModelHost(
        fleet, queue, options=[RequestLimits()], device="cpu", loaders=encoder_loaders(loader)
    )
    rules = RecordRules(
        default_collection="main",
        default_model="mini",
        max_text_bytes=10_000,
        resolve_model=lambda name: name if name in fleet.models else None,
    )
    core = IngestCore(
        QueueEmbedder(queue),
        store,
        rules,
        backoff=Backoff(first_s=0.01, deadline_s=5),
        chunking=Chunking(model_windows(LoadedEncoders(host.engines)), enabled=chunking),
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


@pytest.fixture
async def unchunked() -> AsyncIterator[Stack]:
    async for s in make_stack(QdrantStore(location=":memory:"), chunking=False):
        yield s


async def test_poison_is_dead_lettered_and_its_neighbours_stored(unchunked: Stack) -> None:
    stack = unchunked
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
    # The reason names the flags of `flotilla ingest` that take such a document.
    assert "has 42 tokens, over the 16-token window of model 'mini'" in reasons[b"long"]
    assert "--chunking" in reasons[b"long"] and "--auto-truncate" in reasons[b"long"]
    assert '"truncate"' not in reasons[b"long"]
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
        heard: list[str | None] = []
        stack.core.store_watch.listen(heard.append)
        records = [record(i, f"d{i}", f"text {i}") for i in range(5)]
        report = await stack.process(records)  # returns only once the store confirmed
        assert report.upserted == 5
        assert isinstance(stack.store, FlakyStore) and stack.store.refused == 3
        assert await stack.store.count("main") == 5
        # The watch heard the outage once (the same reason each retry) and its end.
        assert heard == ["connection refused", None]
        assert stack.core.store_watch.reason is None


async def test_store_outage_beyond_the_deadline_raises_and_writes_nothing() -> None:
    async for stack in make_stack(FlakyStore(failures=10_000)):
        stack.core.backoff = Backoff(first_s=0.01, max_s=0.02, deadline_s=0.2)
        with pytest.raises(StoreUnavailable):
            await stack.process([record(0, "d", "text")])  # the caller must not commit
        assert stack.core.store_watch.reason == "connection refused"  # still down


# --- long documents: passages, replacing, deleting ---


def words(n: int, word: str = "clause") -> str:
    """``n`` words in sentences of seven: the fake tokenizer counts one token a word."""
    return " ".join(f"{word}{i}." if i % 7 == 6 else f"{word}{i}" for i in range(n))


async def passages_of(stack: Stack, doc: str, collection: str = "main") -> list[Point]:
    """Every stored point of ``doc``, by passage index (up to 50 looked for)."""
    ids = [chunk_point_id(collection, doc, i) for i in range(50)]
    return sorted(
        await stack.store.retrieve(collection, ids), key=lambda p: p.payload["chunk_index"]
    )


async def test_a_long_document_becomes_passages_with_their_spans(stack: Stack) -> None:
    text = words(40)
    report = await stack.process([record(0, "long", {"text": text, "metadata": {"law": "bgb"}})])
    assert (report.upserted, report.passages, report.dead_lettered) == (1, 3, 0)
    points = await passages_of(stack, "long")
    assert await stack.store.count("main") == len(points) == 3
    assert points[0].id == point_id("main", "long")  # passage 0 keeps the document's id
    runtime = stack.loader.runtimes["mini"]
    covered = []
    for i, point in enumerate(points):
        payload = point.payload
        assert payload["doc_id"] == "long"
        assert (payload["chunk_index"], payload["chunk_count"]) == (i, 3)
        assert payload["text"] == text[payload["char_start"] : payload["char_end"]]
        assert len(payload["text"].split()) <= 14
        assert payload["metadata"] == {"law": "bgb"}
        assert payload["source"] == {"topic": "docs", "partition": 0, "offset": 0}
        np.testing.assert_allclose(
            point.vector, runtime.expected_vector(payload["text"]), atol=1e-5
        )
        covered.extend(payload["text"].split())
    assert covered == text.split()  # in order, every word once (no overlap by default)


async def test_a_document_that_fits_is_one_point_with_its_whole_text(stack: Stack) -> None:
    await stack.process([record(0, "short", " a few words ")])
    [point] = await passages_of(stack, "short")
    assert point.payload["text"] == " a few words "
    assert (point.payload["chunk_count"], point.payload["char_end"]) == (1, 13)


async def test_reingesting_shorter_removes_the_stale_passages(stack: Stack) -> None:
    await stack.process([record(0, "doc", words(60)), record(1, "other", words(30))])
    assert len(await passages_of(stack, "doc")) == 5
    await stack.process([record(2, "doc", words(20, "new"))])
    points = await passages_of(stack, "doc")
    assert [p.payload["chunk_index"] for p in points] == [0, 1]
    assert {p.payload["chunk_count"] for p in points} == {2}
    assert all(p.payload["text"].startswith("new") for p in points)
    assert len(await passages_of(stack, "other")) == 3  # another document is left alone
    assert await stack.store.count("main") == 5
    await stack.process([record(3, "doc", "one line now")])
    assert [p.payload["text"] for p in await passages_of(stack, "doc")] == ["one line now"]
    assert await stack.store.count("main") == 4


async def test_a_tombstone_deletes_every_passage(stack: Stack) -> None:
    await stack.process([record(0, "doc", words(50)), record(1, "keep", words(20))])
    await stack.process([record(2, "doc", None)])
    assert await passages_of(stack, "doc") == []
    assert await stack.store.count("main") == 2
    await stack.process([record(3, "doc", None)])  # again: nothing left to delete
    await stack.process([record(4, "gone", None, flotilla_collection="never-made")])
    assert await stack.store.count("main") == 2


async def test_a_document_stored_whole_before_chunking_is_replaced_then_deleted(
    stack: Stack,
) -> None:
    await stack.process([record(0, "seed", "x")])  # creates the collection
    legacy = {"doc_id": "old", "text": "stored whole", "model": "mini"}  # no chunk fields
    await stack.store.upsert("main", [Point(point_id("main", "old"), [1.0] * 8, legacy)])
    await stack.process([record(1, "old", words(30))])
    points = await passages_of(stack, "old")
    assert [p.payload["chunk_index"] for p in points] == [0, 1, 2]
    await stack.process([record(2, "old", None)])
    assert await passages_of(stack, "old") == []
    assert await stack.store.count("main") == 1


class CrashingStore(QdrantStore):
    """Fails the first stale-passage delete as a process killed between the upsert and
    the delete would leave it: passages written, the old ones still there."""

    def __init__(self) -> None:
        super().__init__(location=":memory:")
        self.crashes = 1

    async def delete_matching(self, collection: str, filter: PayloadFilter) -> None:
        if self.crashes:
            self.crashes -= 1
            raise RuntimeError("killed")
        await super().delete_matching(collection, filter)


async def test_a_crash_between_writing_and_pruning_converges_on_redelivery() -> None:
    async for stack in make_stack(CrashingStore()):
        assert isinstance(stack.store, CrashingStore)
        stack.store.crashes = 0
        await stack.process([record(0, "doc", words(60))])
        stack.store.crashes = 1
        shorter = [record(1, "doc", words(20, "new")), record(2, "more", words(30))]
        with pytest.raises(RuntimeError, match="killed"):
            await stack.process(shorter)  # not committed: the chunk comes again
        assert len(await passages_of(stack, "doc")) == 5  # two new, three stale
        await stack.process(shorter)
        points = await passages_of(stack, "doc")
        assert [(p.payload["chunk_index"], p.payload["chunk_count"]) for p in points] == [
            (0, 2),
            (1, 2),
        ]
        assert await stack.store.count("main") == 2 + 3


async def test_overlap_and_passage_size_follow_the_settings(stack: Stack) -> None:
    chunking = stack.core.chunking
    assert chunking is not None
    stack.core.chunking = Chunking(chunking.windows, max_tokens=10, overlap_tokens=3)
    await stack.process([record(0, "doc", words(30))])
    texts = [p.payload["text"].split() for p in await passages_of(stack, "doc")]
    assert all(len(t) <= 8 for t in texts)  # 10 tokens less the two special ones
    assert sum(len(t) for t in texts) > 30  # the overlap repeats words
    assert texts[0][-1] in texts[1]


class PickyStore(QdrantStore):
    """Refuses for good (a non-retriable store error) any batch holding a point whose
    metadata says ``refuse``, as a store does with a payload it cannot hold."""

    def __init__(self) -> None:
        super().__init__(location=":memory:")
        self.batches = 0

    async def upsert(self, collection: str, points: Sequence[Point]) -> None:
        self.batches += 1
        for p in points:
            refuse = p.payload["metadata"].get("refuse")
            # True refuses every passage, a number only that passage (False is not 0).
            if refuse is True or (type(refuse) is int and refuse == p.payload["chunk_index"]):
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


async def test_a_document_with_a_passage_the_store_refuses_is_not_stored_at_all() -> None:
    async for stack in make_stack(PickyStore()):
        long = " ".join(f"word{i}." for i in range(40))  # three passages of the fake model
        await stack.process([record(0, "doc", {"text": long})])
        assert await stack.store.count("main") == 3
        report = await stack.process(
            [record(1, "doc", {"text": long + " more.", "metadata": {"refuse": 1}}),
             record(2, "fine", "a short one")]
        )  # fmt: skip
        assert (report.upserted, report.dead_lettered) == (1, 1)
        assert "payload not storable" in stack.dead[0][1]
        # Passage 1 refused: what was written of the new version (and the old version,
        # which it was replacing) is gone, rather than a mix of both.
        points = await stack.store.retrieve(
            "main", [chunk_point_id("main", "doc", i) for i in range(4)]
        )
        assert points == []
        assert await stack.store.count("main") == 1


async def test_every_failure_of_one_record_is_counted_by_its_code() -> None:
    records = [
        record(0, "ok", "fine"),
        record(1, "deep", b'{"text": "t", "metadata": {"a": ' + b"[" * 3000 + b"]" * 3000 + b"}}"),
        record(2, "json", b'{"text": '),
        record(3, "long", " ".join(["word"] * 40)),  # over the fake model's 16 tokens
        record(4, "where", {"text": "t", "collection": "no/slashes"}),
        RawRecord(b"hdr", b"text", (("flotilla-model", b"\xff"),), SourceRef("docs", 0, 5)),
    ]
    async for stack in make_stack(QdrantStore(location=":memory:"), chunking=False):
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


class LockedOutStore(QdrantStore):
    """Answers every upsert as a server does to a revoked API key."""

    def __init__(self) -> None:
        super().__init__(location=":memory:")

    async def upsert(self, collection: str, points: Sequence[Point]) -> None:
        raise StoreMisconfigured("refused this client's API key (401)")


async def test_a_refused_api_key_fails_the_chunk_and_dead_letters_nothing() -> None:
    async for stack in make_stack(LockedOutStore()):
        with pytest.raises(StoreMisconfigured):  # uncommitted: redelivered once fixed
            await stack.process([record(i, f"d{i}", f"text {i}") for i in range(4)])
        assert stack.dead == []
