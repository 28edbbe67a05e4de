"""The ingest core, independent of where records come from: one chunk of raw records
in, the store written and every poison dead-lettered, or an exception and nothing
acknowledged.

Order within a chunk: parse -> embed -> check collections -> dead-letter the poison
-> write the last operation per document -> dead-letter what the store refused ->
(the caller commits). Every failure that belongs to one record (its bytes, its
embedding, its collection, its point) dead-letters that record; only a failure of the
whole chunk (the store down past the deadline, the dead-letter topic unreachable)
raises, and then nothing is acknowledged. Because point ids
derive from (collection, document id), a chunk that is processed twice (a crash
before its commit) writes the same points again: nothing is duplicated.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from embedder.errors import FlotillaError
from ingest.embedding import QueueEmbedder
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
    CollectionNotFound,
    Distance,
    Point,
    StoreError,
    VectorStore,
    point_id,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RawRecord:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    source: SourceRef


@dataclass(slots=True)
class ChunkReport:
    upserted: int = 0
    deleted: int = 0
    dead_lettered: int = 0
    tokens: int = 0
    poisons: list[tuple[RawRecord, str]] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)  # Poison.code -> dead letters


DeadLetter = Callable[[Sequence[tuple[RawRecord, str]]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter for retriable failures, up to ``deadline_s``."""

    first_s: float = 0.2
    max_s: float = 10.0
    deadline_s: float = 300.0

    async def run(self, what: str, action: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        start = time.monotonic()
        delay = self.first_s
        while True:
            try:
                return await action(*args)
            except FlotillaError as exc:
                waited = time.monotonic() - start
                if not exc.retriable or waited + delay > self.deadline_s:
                    raise
                log.warning("%s failed (%s); retrying in %.1f s", what, exc.message, delay)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.max_s)


class IngestCore:
    def __init__(
        self,
        embedder: QueueEmbedder,
        store: VectorStore,
        rules: RecordRules,
        *,
        backoff: Backoff | None = None,
        distance: Distance = "cosine",
    ) -> None:
        self.embedder = embedder
        self.store = store
        self.rules = rules
        self.backoff = backoff or Backoff()
        self.distance = distance
        self._collections: dict[str, tuple[str, int]] = {}  # name -> (model, dimension) checked

    async def process(self, records: Sequence[RawRecord], dead_letter: DeadLetter) -> ChunkReport:
        report = ChunkReport()
        by_source = {r.source: r for r in records}
        parsed = [parse_record(r.key, r.value, r.headers, r.source, self.rules) for r in records]
        poisons: list[tuple[RawRecord, str]] = [
            (by_source[p.source], p.reason) for p in parsed if isinstance(p, Poison)
        ]
        codes = {p.source: p.code for p in parsed if isinstance(p, Poison)}
        upserts = [p for p in parsed if isinstance(p, Upsert)]
        vectors = await self._embed(upserts, poisons, by_source)
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
        refused = await self._write(live_upserts, deletes, vectors)
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
        report.deleted = len(deletes)
        return report

    async def _embed(
        self,
        upserts: list[Upsert],
        poisons: list[tuple[RawRecord, str]],
        by_source: dict[SourceRef, RawRecord],
    ) -> dict[SourceRef, list[float]]:
        vectors: dict[SourceRef, list[float]] = {}
        pending = upserts
        attempt = 0
        while pending:
            results = await self.embedder.embed([(u.model, u.text) for u in pending])
            retry: list[Upsert] = []
            for upsert, result in zip(pending, results, strict=True):
                if not isinstance(result, FlotillaError):
                    vectors[upsert.source] = result.tolist()
                elif result.retriable and attempt < 3:
                    retry.append(upsert)
                else:
                    reason = f"embedding failed: {result.message}"
                    poisons.append((by_source[upsert.source], reason))
            pending = retry
            attempt += 1
            if pending:
                await asyncio.sleep(0.5 * attempt)
        return vectors

    async def _check_collections(
        self,
        upserts: list[Upsert],
        vectors: dict[SourceRef, list[float]],
        poisons: list[tuple[RawRecord, str]],
        by_source: dict[SourceRef, RawRecord],
    ) -> list[Upsert]:
        kept: list[Upsert] = []
        refused: dict[str, str] = {}
        for op in upserts:
            dimension = len(vectors[op.source])
            if self._collections.get(op.collection) != (op.model, dimension):
                if op.collection not in refused:
                    try:
                        await self.backoff.run(
                            f"creating collection {op.collection}",
                            self.store.ensure_collection,
                            op.collection,
                            dimension,
                            self.distance,
                            op.model,
                        )
                        self._collections[op.collection] = (op.model, dimension)
                    except StoreError as exc:
                        if exc.retriable:  # still failing at the deadline: the chunk fails
                            raise
                        # The model guard, a name the store refuses: these records' fault.
                        refused[op.collection] = exc.message
                if op.collection in refused:
                    poisons.append((by_source[op.source], refused[op.collection]))
                    continue
            kept.append(op)
        return kept

    async def _write(
        self, upserts: list[Upsert], deletes: list[Delete], vectors: dict[SourceRef, list[float]]
    ) -> list[tuple[Operation, str]]:
        """Writes the chunk; returns the operations the store refused, each with the reason."""
        by_collection: dict[str, list[tuple[Upsert, Point]]] = {}
        for op in upserts:
            by_collection.setdefault(op.collection, []).append(
                (
                    op,
                    Point(
                        id=point_id(op.collection, op.doc_id),
                        vector=vectors[op.source],
                        payload={
                            "doc_id": op.doc_id,
                            "text": op.text,
                            "metadata": op.metadata,
                            "model": op.model,
                            "source": {
                                "topic": op.source.topic,
                                "partition": op.source.partition,
                                "offset": op.source.offset,
                            },
                        },
                    ),
                )
            )
        refused: list[tuple[Operation, str]] = []
        for collection, writes in by_collection.items():
            refused += await self._upsert(collection, writes)
        deletes_by_collection: dict[str, list[Delete]] = {}
        for gone in deletes:
            deletes_by_collection.setdefault(gone.collection, []).append(gone)
        for collection, ops in deletes_by_collection.items():
            ids = [point_id(collection, op.doc_id) for op in ops]
            try:
                await self.backoff.run(
                    f"deleting {len(ids)} points from {collection}",
                    self.store.delete,
                    collection,
                    ids,
                )
            except CollectionNotFound:
                pass  # a collection never written to has nothing to delete
            except StoreError as exc:
                if exc.retriable:
                    raise
                refused += [(op, f"the store refused the delete: {exc.message}") for op in ops]
        return refused

    async def _upsert(
        self, collection: str, writes: list[tuple[Upsert, Point]]
    ) -> list[tuple[Operation, str]]:
        """Upserts the points; when the store refuses the batch for good (a payload it
        cannot hold, say), halves it until each refused point stands alone and returns
        those with the reason: one bad point costs a few more writes, not the chunk."""
        try:
            await self.backoff.run(
                f"upserting {len(writes)} points into {collection}",
                self.store.upsert,
                collection,
                [point for _, point in writes],
            )
        except StoreError as exc:
            if exc.retriable:  # still failing at the deadline: the chunk fails
                raise
            if len(writes) == 1:
                return [(writes[0][0], f"the store refused the point: {exc.message}")]
            half = len(writes) // 2
            return await self._upsert(collection, writes[:half]) + await self._upsert(
                collection, writes[half:]
            )
        return []
