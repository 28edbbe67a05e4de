"""The embedded default: ``VectorStore`` over Qdrant's own engine in-process (qdrant-edge-py).

Layout under the data directory, one shard per collection::

    <data_dir>/<collection>/collection.json   model, dimension, distance (the engine has
                                              no collection metadata, so this sidecar
                                              carries the model guard)
    <data_dir>/<collection>/shard/            the EdgeShard: WAL + segments

**One process owns a shard.** The engine locks a shard's WAL while it is open; a second
``EdgeStore`` on the same directory, in this process or another, waits ``lock_wait_s``
(1 s: a predecessor releases its lock as it exits, at once when killed) and
then gets ``ShardLocked``, not retriable: the owner keeps the shard while it runs. The
owner writes ``owner.json`` beside the shard (pid, command line, and the URL it serves,
if it does), so the error names who owns it and the ways in that work: the owner's
documents route, its own Kafka ingest, or a Qdrant server shared by every process.

**Durability.** ``upsert`` and ``delete`` return once the operation is in the shard's
WAL: a process killed with SIGKILL right after keeps every acknowledged point (tested).
Power loss is not covered beyond what the WAL and the OS give; ``close()`` flushes.

**Exact search, always.** The engine builds HNSW only when ``optimize()`` is called,
which this store never does, and its filtered HNSW search loses recall badly; so every
search is an exact scan, which is right by construction. Measured on 2 cores at
20k x 384-d: ~650 unfiltered searches/s, ~60/s with a payload filter (no payload index).

**Threads.** Every engine call runs on this store's single worker thread, which
serialises access to the shards. The engine holds the GIL while it works, so the event
loop does wait out each call; keep batches modest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import qdrant_edge as qe

from embedder.core.lifecycle import Closable
from ingest.store.contract import (
    DISTANCES,
    AtLeast,
    CollectionSpec,
    Condition,
    Distance,
    Hit,
    PayloadFilter,
    Point,
    VectorLike,
    as_hits,
    as_vector,
    check_collection_name,
    check_delete_filter,
    check_filter,
    check_ids,
    check_limit,
    check_open,
    check_spec,
    in_asked_order,
    latest_by_id,
    refuse_mismatch,
)
from ingest.store.errors import (
    CollectionModelMismatch,
    CollectionNotFound,
    InvalidStoreRequest,
    ShardLocked,
    StoreError,
    classified,
)
from ingest.store.owner import owned_message, read_owner, write_owner

SIDECAR = "collection.json"
SHARD_DIR = "shard"
LOCK_POLL_S = 0.1

_DISTANCE: dict[Distance, qe.Distance] = {
    "cosine": qe.Distance.Cosine,
    "dot": qe.Distance.Dot,
    "euclid": qe.Distance.Euclid,
    "manhattan": qe.Distance.Manhattan,
}

T = TypeVar("T")


class EdgeStore(Closable):
    """A ``VectorStore`` on qdrant-edge shards under ``data_dir`` (see the module doc)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        serving_url: str | None = None,
        lock_wait_s: float = 1.0,
    ) -> None:
        """``serving_url``: where this process takes documents for its collections (a
        server's base URL), named to any other process that tries to open them."""
        self._root = Path(data_dir)
        self._serving_url = serving_url
        self._lock_wait_s = lock_wait_s
        self._root.mkdir(parents=True, exist_ok=True)
        self._shards: dict[str, tuple[qe.EdgeShard, CollectionSpec]] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-store")

    async def ensure_collection(
        self, name: str, dimension: int, distance: Distance, model: str
    ) -> CollectionSpec:
        wanted = check_spec(name, dimension, distance, model)
        return await self._run(self._ensure, wanted)

    async def upsert(self, collection: str, points: Sequence[Point]) -> None:
        await self._run(self._upsert, check_collection_name(collection), points)

    async def delete(self, collection: str, ids: Sequence[str]) -> None:
        await self._run(self._delete, check_collection_name(collection), check_ids(ids))

    async def delete_matching(self, collection: str, filter: PayloadFilter) -> None:
        await self._run(
            self._delete_matching, check_collection_name(collection), check_delete_filter(filter)
        )

    async def search(
        self,
        collection: str,
        vector: VectorLike,
        limit: int = 10,
        filter: PayloadFilter | None = None,
    ) -> list[Hit]:
        return await self._run(
            self._search,
            check_collection_name(collection),
            vector,
            check_limit(limit),
            check_filter(filter),
        )

    async def count(self, collection: str) -> int:
        return await self._run(self._count, check_collection_name(collection))

    async def describe(self, collection: str) -> CollectionSpec:
        """What an existing collection holds (``CollectionNotFound`` if none)."""
        return await self._run(self._describe, check_collection_name(collection))

    async def retrieve(self, collection: str, ids: Sequence[str]) -> list[Point]:
        return await self._run(self._retrieve, check_collection_name(collection), check_ids(ids))

    async def _release(self) -> None:
        """Close (and so flush) every shard on the worker thread, then end the thread."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._close_shards)
        finally:
            self._executor.shutdown(wait=False)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn`` on the worker thread; a shard found locked is tried again for
        ``lock_wait_s``, waiting here, so the thread serves other collections meanwhile."""
        check_open(self)
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self._lock_wait_s
        while True:
            try:
                return await loop.run_in_executor(self._executor, functools.partial(fn, *args))
            except ShardLocked:
                if time.monotonic() + LOCK_POLL_S > deadline:
                    raise
                await asyncio.sleep(LOCK_POLL_S)

    # --- everything below runs on the worker thread, one call at a time ---

    def _ensure(self, wanted: CollectionSpec) -> CollectionSpec:
        opened = self._shards.get(wanted.name)
        if opened is None:
            folder = self._root / wanted.name
            if not (folder / SIDECAR).exists() and (folder / SHARD_DIR).exists():
                raise CollectionModelMismatch(
                    f"collection {wanted.name!r} has a shard but no {SIDECAR} saying which"
                    " model it holds: re-embed into a new collection"
                )
            with classified(_classify, wanted.name):
                folder.mkdir(exist_ok=True)
                _write_sidecar_once(folder / SIDECAR, wanted)
            # Whoever wrote the sidecar first decides what the collection holds.
            existing = _read_sidecar(folder / SIDECAR, wanted.name)
            refuse_mismatch(existing, wanted)
            opened = self._open(existing)
        refuse_mismatch(opened[1], wanted)
        return opened[1]

    def _open(self, spec: CollectionSpec) -> tuple[qe.EdgeShard, CollectionSpec]:
        try:
            shard = self._load_or_create(self._root / spec.name / SHARD_DIR, spec)
        except ShardLocked as exc:
            owner = read_owner(self._root / spec.name)
            raise ShardLocked(owned_message(spec.name, self._root, owner)) from exc
        self._shards[spec.name] = (shard, spec)
        write_owner(self._root / spec.name, self._serving_url)
        return shard, spec

    @staticmethod
    def _load_or_create(path: Path, spec: CollectionSpec) -> qe.EdgeShard:
        with classified(_classify, spec.name):
            if path.exists():
                return qe.EdgeShard.load(str(path))
            config = qe.EdgeConfig(
                vectors=qe.EdgeVectorParams(size=spec.dimension, distance=_DISTANCE[spec.distance])
            )
            return qe.EdgeShard.create(str(path), config)

    def _shard(self, collection: str) -> tuple[qe.EdgeShard, CollectionSpec]:
        """The open shard, loading an existing collection on first use."""
        opened = self._shards.get(collection)
        if opened is not None:
            return opened
        sidecar = self._root / collection / SIDECAR
        if not sidecar.exists():
            raise CollectionNotFound(f"collection {collection!r} not found under {self._root}")
        return self._open(_read_sidecar(sidecar, collection))

    def _upsert(self, collection: str, points: Sequence[Point]) -> None:
        shard, spec = self._shard(collection)
        latest = latest_by_id(points)
        if not latest:
            return
        with classified(_classify, collection):
            batch = [
                qe.Point(p.id, as_vector(p.vector, spec.dimension), dict(p.payload)) for p in latest
            ]
            shard.update(qe.UpdateOperation.upsert_points(batch))

    def _delete(self, collection: str, ids: list[str]) -> None:
        shard, _ = self._shard(collection)
        if not ids:
            return
        with classified(_classify, collection):
            shard.update(qe.UpdateOperation.delete_points(list(ids)))

    def _delete_matching(self, collection: str, conditions: list[Condition]) -> None:
        shard, _ = self._shard(collection)
        selected = _to_filter(conditions)
        assert selected is not None  # check_delete_filter refuses an empty filter
        with classified(_classify, collection):
            shard.update(qe.UpdateOperation.delete_points_by_filter(selected))

    def _search(
        self, collection: str, vector: VectorLike, limit: int, conditions: list[Condition]
    ) -> list[Hit]:
        shard, spec = self._shard(collection)
        request = qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(as_vector(vector, spec.dimension)),
            filter=_to_filter(conditions),
            with_payload=True,
            with_vector=False,
            params=qe.SearchParams(exact=True),
        )
        with classified(_classify, collection):
            found = shard.query(request)
        return as_hits(found)

    def _describe(self, collection: str) -> CollectionSpec:
        return self._shard(collection)[1]

    def _count(self, collection: str) -> int:
        shard, _ = self._shard(collection)
        with classified(_classify, collection):
            return shard.count(qe.CountRequest(exact=True))

    def _retrieve(self, collection: str, ids: list[str]) -> list[Point]:
        shard, _ = self._shard(collection)
        if not ids:
            return []
        with classified(_classify, collection):
            records = shard.retrieve(list(ids), with_payload=True, with_vector=True)
        return in_asked_order(records, ids)

    def _close_shards(self) -> None:
        errors: list[str] = []
        while self._shards:
            name, (shard, _) = self._shards.popitem()
            try:
                shard.close()
            except Exception as exc:  # close the others before reporting
                errors.append(f"{name}: {exc}")
        if errors:
            raise StoreError(f"closing shards failed: {'; '.join(errors)}")


def _to_filter(conditions: list[Condition]) -> qe.Filter | None:
    if not conditions:
        return None
    must: list[qe.FieldCondition | qe.Filter] = []
    for key, value in conditions:
        if isinstance(value, AtLeast):
            must.append(qe.FieldCondition(key=key, range=qe.RangeFloat(gte=float(value.value))))
            continue
        match: qe.MatchAny | qe.MatchValue
        if isinstance(value, list):
            match = qe.MatchAny(value)
        elif isinstance(value, bool):
            # qdrant-edge-py 0.9.0 reads a Python bool here as the int 0 or 1, which
            # matches no stored bool; numpy's bool is read as a bool.
            match = qe.MatchValue(cast(bool, np.bool_(value)))
        else:
            match = qe.MatchValue(value)
        must.append(qe.FieldCondition(key=key, match=match))
    return qe.Filter(must=list(must))


def _write_sidecar_once(path: Path, spec: CollectionSpec) -> None:
    """Write the sidecar unless one exists; never overwrite (``link`` fails if it exists)."""
    if path.exists():
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"format": 1, **asdict(spec)}, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        tmp.unlink(missing_ok=True)


def _read_sidecar(path: Path, name: str) -> CollectionSpec:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        distance = data["distance"]
        if distance not in DISTANCES:
            raise ValueError(f"unknown distance {distance!r}")
        return CollectionSpec(
            name=name, dimension=int(data["dimension"]), distance=distance, model=str(data["model"])
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc


def _classify(exc: Exception, collection: str) -> StoreError:
    """qdrant-edge raises bare ``Exception``s; sort them by what they say."""
    message = str(exc)
    if "WouldBlock" in message:
        return ShardLocked(f"collection {collection!r} is open in another process or store")
    if isinstance(exc, TypeError | ValueError) or "dimension error" in message:
        return InvalidStoreRequest(f"collection {collection!r}: {message}")
    return StoreError(f"qdrant-edge failed on collection {collection!r}: {message}")
