"""The ingest core, independent of where records come from: one chunk of raw records
in, the store written and every poison dead-lettered, or an exception and nothing
acknowledged.

Order within a chunk: parse -> read the documents that are images or PDFs (OCR through
the work queue: ``ingest.reading``) -> split into passages (each page alone) -> embed
-> check collections -> dead-letter the poison -> write the last operation per document
-> dead-letter what the store refused -> (the caller commits). Every failure that
belongs to one record (its bytes, its pages, its passages, its embedding, its
collection, its points) dead-letters that record; only a failure of the whole chunk
(the store down past the deadline, the dead-letter topic unreachable) raises, and then
nothing is acknowledged. Because point ids derive from (collection, document id,
passage index), a chunk that is processed twice (a crash before its commit) writes the
same points again: nothing is duplicated. A document read by OCR numbers its passages
through its pages in page order; should a redelivery read a page differently, the
replacement below still leaves exactly the new reading's points.

**Replacing a document** writes its passages 0..n-1 (overwriting the same ids), then
deletes its points with ``chunk_index >= n``: what is left of a longer earlier version.
A crash between the two steps leaves the chunk uncommitted; its redelivery does both
again, so the store converges. A tombstone deletes every point of its document (by
``doc_id``). Neither step ever leaves a document without its points while it has some.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from embedder.core import tracing
from embedder.core.errors import FlotillaError, LimitExceeded
from ingest.chunking import Chunking, Passage, page_passages
from ingest.embedding import QueueEmbedder
from ingest.health import StoreWatch
from ingest.reading import QueueReader, ReadFailed, ReadPage
from ingest.records import (
    Delete,
    Operation,
    Poison,
    RecordRules,
    SourceRef,
    Upsert,
    last_writes,
    parse_record,
)
from ingest.store import (
    AtLeast,
    CollectionNotFound,
    Distance,
    Point,
    StoreError,
    VectorStore,
    chunk_point_id,
    records_fault,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Points per store call: a long document's passages can make a chunk of records many
# points, and the embedded engine holds the GIL for the whole of one call.
UPSERT_BATCH_POINTS = 1024


@dataclass(frozen=True, slots=True)
class RawRecord:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    source: SourceRef


@dataclass(slots=True)
class ChunkReport:
    upserted: int = 0  # documents
    passages: int = 0  # their points
    deleted: int = 0
    dead_lettered: int = 0
    tokens: int = 0
    poisons: list[tuple[RawRecord, str]] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)  # Poison.code -> dead letters


DeadLetter = Callable[[Sequence[tuple[RawRecord, str]]], Awaitable[None]]


def _attributes(source: SourceRef) -> dict[str, str | int]:
    """A record's place, as OpenTelemetry's messaging conventions name it."""
    return {
        "messaging.system": "kafka",
        "messaging.destination.name": source.topic,
        "messaging.destination.partition.id": str(source.partition),
        "messaging.kafka.offset": source.offset,
    }


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter for retriable failures, up to ``deadline_s``."""

    first_s: float = 0.2
    max_s: float = 10.0
    deadline_s: float = 300.0

    async def run(
        self,
        what: str,
        action: Callable[..., Awaitable[_T]],
        *args: Any,
        watch: StoreWatch | None = None,
    ) -> _T:
        """``action(*args)``, retried while it fails retriably; ``watch`` hears of each
        retry and of the success that ends them."""
        start = time.monotonic()
        delay = self.first_s
        while True:
            try:
                done = await action(*args)
            except FlotillaError as exc:
                waited = time.monotonic() - start
                if not exc.retriable or waited + delay > self.deadline_s:
                    raise
                if watch is not None:
                    watch.down(exc.message)
                log.warning("%s failed (%s); retrying in %.1f s", what, exc.message, delay)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.max_s)
            else:
                if watch is not None:
                    watch.up()
                return done


class IngestCore:
    """``chunking`` splits documents over their model's window into passages (see
    ``ingest.chunking``); without it every document goes whole, as one point (a document
    read by OCR: one point a page). ``reader`` reads the records that carry an image or a
    PDF; without it they are dead-lettered."""

    def __init__(
        self,
        embedder: QueueEmbedder,
        store: VectorStore,
        rules: RecordRules,
        *,
        backoff: Backoff | None = None,
        distance: Distance = "cosine",
        chunking: Chunking | None = None,
        reader: QueueReader | None = None,
    ) -> None:
        self.embedder = embedder
        self.reader = reader
        self.store = store
        self.rules = rules
        self.backoff = backoff or Backoff()
        # Hears of the store calls' retries: the supervisor reports ingest as waiting.
        self.store_watch = StoreWatch()
        self.distance = distance
        self.chunking = chunking
        self._collections: dict[str, tuple[str, int]] = {}  # name -> (model, dimension) checked

    async def _on_store(self, what: str, action: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """A store call, retried with backoff while the store is unavailable."""
        return await self.backoff.run(what, action, *args, watch=self.store_watch)

    async def process(self, records: Sequence[RawRecord], dead_letter: DeadLetter) -> ChunkReport:
        if not tracing.on():
            return await self._process(records, dead_letter)
        # A record a producer traced continues that trace: a span of its own for the
        # chunk's embedding and writing (embedder.core.tracing), failed if dead-lettered.
        traced = tracing.ingest_records([(r.headers, _attributes(r.source)) for r in records])
        try:
            report = await self._process(records, dead_letter)
            index = {r.source: i for i, r in enumerate(records)}
            for record, reason in report.poisons:
                traced.failed(index[record.source], reason)
            return report
        finally:
            traced.end()

    async def _process(self, records: Sequence[RawRecord], dead_letter: DeadLetter) -> ChunkReport:
        report = ChunkReport()
        by_source = {r.source: r for r in records}
        parsed = [parse_record(r.key, r.value, r.headers, r.source, self.rules) for r in records]
        poisons: list[tuple[RawRecord, str]] = [
            (by_source[p.source], p.reason) for p in parsed if isinstance(p, Poison)
        ]
        codes = {p.source: p.code for p in parsed if isinstance(p, Poison)}
        upserts = [p for p in parsed if isinstance(p, Upsert)]
        pages = await self._read(upserts, poisons, codes, by_source)
        upserts = [u for u in upserts if u.document is None or u.source in pages]
        passages = await asyncio.to_thread(self._split, upserts, pages, poisons, codes, by_source)
        codes.update((r.source, "split_failed") for r, _ in poisons if r.source not in codes)
        vectors = await self._embed(
            [u for u in upserts if u.source in passages], passages, poisons, by_source
        )
        codes.update((r.source, "embedding_failed") for r, _ in poisons if r.source not in codes)
        operations: list[Operation] = []
        for op in parsed:
            if isinstance(op, Delete) or (isinstance(op, Upsert) and op.source in vectors):
                operations.append(op)
        # Failed upserts drop out before collapsing, so a poisoned write never hides
        # an earlier good write of the same document.
        live_upserts, deletes = last_writes(operations)
        live_upserts = await self._check_collections(live_upserts, vectors, poisons, by_source)
        codes.update((r.source, "collection_refused") for r, _ in poisons if r.source not in codes)
        if poisons:
            await dead_letter(poisons)
        refused = await self._write(live_upserts, deletes, passages, vectors)
        if refused:
            await dead_letter([(by_source[op.source], reason) for op, reason in refused])
            poisons += [(by_source[op.source], reason) for op, reason in refused]
            codes.update((op.source, "store_refused") for op, _ in refused)
            gone = {op.source for op, _ in refused}
            live_upserts = [op for op in live_upserts if op.source not in gone]
            deletes = [op for op in deletes if op.source not in gone]
        report.dead_lettered = len(poisons)
        report.poisons = poisons
        for record, _ in poisons:
            code = codes.get(record.source, "invalid_record")
            report.reasons[code] = report.reasons.get(code, 0) + 1
        report.upserted = len(live_upserts)
        report.passages = sum(len(passages[op.source]) for op in live_upserts)
        report.deleted = len(deletes)
        return report

    async def _read(
        self,
        upserts: list[Upsert],
        poisons: list[tuple[RawRecord, str]],
        codes: dict[SourceRef, str],
        by_source: dict[SourceRef, RawRecord],
    ) -> dict[SourceRef, list[ReadPage]]:
        """The pages of each document that is an image or PDF, read by the OCR model; one
        that cannot be read is dead-lettered with the reason and its code."""
        documents = [u for u in upserts if u.document is not None]
        if not documents:
            return {}
        if self.reader is None:
            for op in documents:
                poisons.append((by_source[op.source], "no OCR model reads documents here"))
                codes[op.source] = "no_ocr_model"
            return {}
        read = await self.reader.read([op.document for op in documents if op.document])
        out: dict[SourceRef, list[ReadPage]] = {}
        for op, outcome in zip(documents, read, strict=True):
            if isinstance(outcome, ReadFailed):
                poisons.append((by_source[op.source], outcome.reason))
                codes[op.source] = outcome.code
            else:
                out[op.source] = outcome
        return out

    def _split(
        self,
        upserts: list[Upsert],
        pages: dict[SourceRef, list[ReadPage]],
        poisons: list[tuple[RawRecord, str]],
        codes: dict[SourceRef, str],
        by_source: dict[SourceRef, RawRecord],
    ) -> dict[SourceRef, list[Passage]]:
        """Each document's passages (in a thread: tokenizing long texts takes a while)."""
        out: dict[SourceRef, list[Passage]] = {}
        for op in upserts:
            try:
                if op.source in pages:
                    parts = page_passages(partial(self._passages, op), pages[op.source])
                    if not parts:
                        count = len(pages[op.source])
                        poisons.append(
                            (by_source[op.source], f"no text was found on its {count} page(s)")
                        )
                        codes[op.source] = "empty_text"
                        continue
                    out[op.source] = parts
                else:
                    out[op.source] = self._passages(op, op.text)
            except ValueError as exc:  # passage settings that leave a model no room
                poisons.append((by_source[op.source], f"cannot split the document: {exc}"))
        return out

    def _passages(self, op: Upsert, text: str) -> list[Passage]:
        if self.chunking is None:
            return [Passage(0, 0, len(text), text)]
        return self.chunking.split(op.model, text)

    async def _embed(
        self,
        upserts: list[Upsert],
        passages: dict[SourceRef, list[Passage]],
        poisons: list[tuple[RawRecord, str]],
        by_source: dict[SourceRef, RawRecord],
    ) -> dict[SourceRef, list[list[float]]]:
        """Every passage's vector, by document; a document with a passage that cannot be
        embedded is dead-lettered whole, with the first such passage's reason."""
        got: dict[SourceRef, list[list[float] | None]] = {
            u.source: [None] * len(passages[u.source]) for u in upserts
        }
        pending = [(u, p) for u in upserts for p in passages[u.source]]
        failed: set[SourceRef] = set()
        attempt = 0
        while pending:
            results = await self.embedder.embed([(u.model, p.text) for u, p in pending])
            retry: list[tuple[Upsert, Passage]] = []
            for (upsert, passage), result in zip(pending, results, strict=True):
                if upsert.source in failed:
                    continue
                if not isinstance(result, FlotillaError):
                    got[upsert.source][passage.index] = result.tolist()
                elif result.retriable and attempt < 3:
                    retry.append((upsert, passage))
                else:
                    failed.add(upsert.source)
                    reason = self._reason(upsert, passage, result)
                    poisons.append((by_source[upsert.source], reason))
            pending = [(u, p) for u, p in retry if u.source not in failed]
            attempt += 1
            if pending:
                await asyncio.sleep(0.5 * attempt)
        return {
            source: [v for v in vectors if v is not None]
            for source, vectors in got.items()
            if source not in failed
        }

    def _reason(self, upsert: Upsert, passage: Passage, error: FlotillaError) -> str:
        if isinstance(error, LimitExceeded) and self.chunking is not None:
            text = upsert.text if upsert.document is None else passage.text  # a page's
            return self.chunking.too_long(upsert.model, text)
        return f"embedding failed: {error.message}"

    async def _check_collections(
        self,
        upserts: list[Upsert],
        vectors: dict[SourceRef, list[list[float]]],
        poisons: list[tuple[RawRecord, str]],
        by_source: dict[SourceRef, RawRecord],
    ) -> list[Upsert]:
        kept: list[Upsert] = []
        refused: dict[str, str] = {}
        for op in upserts:
            dimension = len(vectors[op.source][0])
            if self._collections.get(op.collection) != (op.model, dimension):
                if op.collection not in refused:
                    try:
                        await self._on_store(
                            f"creating collection {op.collection}",
                            self.store.ensure_collection,
                            op.collection,
                            dimension,
                            self.distance,
                            op.model,
                        )
                        self._collections[op.collection] = (op.model, dimension)
                    except StoreError as exc:
                        if not records_fault(exc):  # the chunk fails, nothing committed
                            raise
                        # The model guard, a name the store refuses: these records' fault.
                        refused[op.collection] = exc.message
                if op.collection in refused:
                    poisons.append((by_source[op.source], refused[op.collection]))
                    continue
            kept.append(op)
        return kept

    async def _write(
        self,
        upserts: list[Upsert],
        deletes: list[Delete],
        passages: dict[SourceRef, list[Passage]],
        vectors: dict[SourceRef, list[list[float]]],
    ) -> list[tuple[Operation, str]]:
        """Writes the chunk; returns the operations the store refused, each with the
        reason. A document with a passage the store refuses is refused whole, and what
        was written of it is deleted again: it is stored complete or not at all."""
        refused = await self._upsert_points(_points(upserts, passages, vectors))
        await self._delete_stale(upserts, passages, refused)
        await self._delete_documents(deletes, refused)
        return list(refused.values())

    async def _upsert_points(
        self, by_collection: dict[str, list[tuple[Upsert, Point]]]
    ) -> dict[SourceRef, tuple[Operation, str]]:
        """Upserts each collection's points, ``UPSERT_BATCH_POINTS`` a call; returns the
        documents with a point the store refused, each with the first reason."""
        refused: dict[SourceRef, tuple[Operation, str]] = {}
        for collection, writes in by_collection.items():
            for start in range(0, len(writes), UPSERT_BATCH_POINTS):
                for op, reason in await self._upsert(
                    collection, writes[start : start + UPSERT_BATCH_POINTS]
                ):
                    refused.setdefault(op.source, (op, reason))
        return refused

    async def _delete_stale(
        self,
        upserts: list[Upsert],
        passages: dict[SourceRef, list[Passage]],
        refused: dict[SourceRef, tuple[Operation, str]],
    ) -> None:
        """Deletes, of each document written whole, the passages past its new count:
        what is left of a longer earlier version."""
        # Per collection, the documents by their new passage count: one delete of what
        # lies past that count serves all of them.
        counts: dict[str, dict[int, list[str]]] = {}
        for op in upserts:
            if op.source not in refused:
                by_count = counts.setdefault(op.collection, {})
                by_count.setdefault(len(passages[op.source]), []).append(op.doc_id)
        for collection, by_count in counts.items():
            for count, doc_ids in by_count.items():
                await self._on_store(
                    f"deleting stale passages of {len(doc_ids)} documents from {collection}",
                    self.store.delete_matching,
                    collection,
                    {"doc_id": doc_ids, "chunk_index": AtLeast(count)},
                )

    async def _delete_documents(
        self, deletes: list[Delete], refused: dict[SourceRef, tuple[Operation, str]]
    ) -> None:
        """Deletes the tombstoned documents and what was written of the refused ones; a
        delete the store refuses for good joins ``refused``."""
        deletes_by_collection: dict[str, list[Operation]] = {}
        for gone in deletes:
            deletes_by_collection.setdefault(gone.collection, []).append(gone)
        for written, _ in refused.values():  # what was written of a refused document
            deletes_by_collection.setdefault(written.collection, []).append(written)
        for collection, ops in deletes_by_collection.items():
            doc_ids = list(dict.fromkeys(each.doc_id for each in ops))
            try:
                await self._on_store(
                    f"deleting {len(doc_ids)} documents from {collection}",
                    self.store.delete_matching,
                    collection,
                    {"doc_id": doc_ids},
                )
            except CollectionNotFound:
                pass  # a collection never written to has nothing to delete
            except StoreError as exc:
                if not records_fault(exc):
                    raise
                for refused_op in ops:
                    reason = f"the store refused the delete: {exc.message}"
                    refused.setdefault(refused_op.source, (refused_op, reason))

    async def _upsert(
        self, collection: str, writes: list[tuple[Upsert, Point]]
    ) -> list[tuple[Upsert, str]]:
        """Upserts the points; when the store refuses the batch for good (a payload it
        cannot hold, say), halves it until each refused point stands alone and returns
        those with the reason: one bad point costs a few more writes, not the chunk."""
        try:
            await self._on_store(
                f"upserting {len(writes)} points into {collection}",
                self.store.upsert,
                collection,
                [point for _, point in writes],
            )
        except StoreError as exc:
            if not records_fault(exc):  # still failing at the deadline, or misconfigured
                raise
            if len(writes) == 1:
                return [(writes[0][0], f"the store refused the point: {exc.message}")]
            half = len(writes) // 2
            return await self._upsert(collection, writes[:half]) + await self._upsert(
                collection, writes[half:]
            )
        return []


def _points(
    upserts: list[Upsert],
    passages: dict[SourceRef, list[Passage]],
    vectors: dict[SourceRef, list[list[float]]],
) -> dict[str, list[tuple[Upsert, Point]]]:
    """Every passage as its point, by collection, each with the document it belongs to."""
    by_collection: dict[str, list[tuple[Upsert, Point]]] = {}
    for op in upserts:
        parts = passages[op.source]
        by_collection.setdefault(op.collection, []).extend(
            (
                op,
                Point(
                    id=chunk_point_id(op.collection, op.doc_id, part.index),
                    vector=vector,
                    payload=_payload(op, part, len(parts)),
                ),
            )
            for part, vector in zip(parts, vectors[op.source], strict=True)
        )
    return by_collection


def _payload(op: Upsert, part: Passage, count: int) -> dict[str, Any]:
    """A passage's payload: the document's own fields and which part of it this is; of a
    document read by OCR, also its page (0-based), lines and their box (the character
    offsets then index the page's text)."""
    payload = {
        "doc_id": op.doc_id,
        "text": part.text,
        "chunk_index": part.index,
        "chunk_count": count,
        "char_start": part.start,
        "char_end": part.end,
        "metadata": op.metadata,
        "model": op.model,
        "source": {
            "topic": op.source.topic,
            "partition": op.source.partition,
            "offset": op.source.offset,
        },
    }
    if part.page is not None:
        payload["page"] = part.page
        payload["line_start"] = part.line_start
        payload["line_end"] = part.line_end
        payload["bbox"] = [round(v, 1) for v in part.bbox] if part.bbox else None
    return payload
