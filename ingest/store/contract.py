"""The vector store contract: what the ingest pipeline needs from Qdrant, and nothing more.

The ``VectorStore`` protocol, its values (``Point``, ``Hit``, ``CollectionSpec``), the
point ids, the checks both engines share so that both refuse the same inputs the same
way, and the conversions of what they return into the contract's values
(``tests/ingest/store/test_contract.py`` runs one contract against both).
The engines (``edge.py``, ``qdrant.py``) import this module; ``ingest.store`` opens them.

**Async.** Every method is a coroutine because the pipeline lives on an event loop. The
server path is natively async (``AsyncQdrantClient``, no threads); the edge path runs
each call on the store's own single worker thread, which also serialises access to its
shards. Note that qdrant-edge holds the GIL while it works, so the thread keeps the
loop's code simple but does not let Python run beside a long call: keep upsert batches
and search limits modest (a 256-point upsert of 384-d vectors takes a few ms).

**Ids** are UUID strings; ``point_id(collection, document_id)`` derives them, so a
redelivered document overwrites its point instead of duplicating it, and
``chunk_point_id(collection, document_id, index)`` those of a document's passages.

**Filters** are a flat map, every entry ANDed::

    {"metadata.lang": "de", "source": ["bgb", "hgb"], "chunk_index": AtLeast(2)}

A key is a dotted payload path; a value is a ``str``, ``int`` or ``bool`` to match
exactly (an array field matches if any element does), a non-empty list of ``str``
or of ``int`` to match any of, or ``AtLeast(n)`` for a number at least ``n`` (what
dropping a document's passages past its new count needs). Floats, other ranges and
negation are deliberately absent. ``search`` and ``delete_matching`` take the same
filters.

**Scores** are the engine's own, best first: similarity for ``cosine`` and ``dot``
(higher is nearer), distance for ``euclid`` and ``manhattan`` (lower is nearer). With
``cosine`` the engines store the unit vector, so ``retrieve`` returns the normalised
vector, not the one written.

**The model guard.** ``ensure_collection`` records the embedding model with the
collection and refuses (``CollectionModelMismatch``, 409) to reuse a collection of
another model, dimension or distance: vectors of two models in one index make every
search quietly wrong.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol, Self, TypeAlias, get_args

import numpy as np
import numpy.typing as npt

from embedder.core.lifecycle import Closable
from ingest.store.errors import CollectionModelMismatch, InvalidStoreRequest, StoreError

# Never change: every stored point id is derived from it, so a new value would re-key
# every collection and turn redeliveries into duplicates.
POINT_ID_NAMESPACE = uuid.UUID("6f1c1b0e-3d2a-5b8e-9c47-0a8e5f3d2c71")

Distance: TypeAlias = Literal["cosine", "dot", "euclid", "manhattan"]
DISTANCES: tuple[Distance, ...] = get_args(Distance)

VectorLike: TypeAlias = Sequence[float] | npt.NDArray[np.floating[Any]]
MatchValue: TypeAlias = str | int | bool


@dataclass(frozen=True, slots=True)
class AtLeast:
    """A filter value: the payload field is a number at least ``value``."""

    value: int


PayloadFilter: TypeAlias = Mapping[str, MatchValue | Sequence[str] | Sequence[int] | AtLeast]
# A checked filter: (payload path, exact value, list of alternatives or lower bound), ANDed.
Condition: TypeAlias = tuple[str, MatchValue | list[str] | list[int] | AtLeast]

# Qdrant's own rule for collection names is looser; this one is also a safe directory name.
_COLLECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


def point_id(collection: str, document_id: str) -> str:
    """The deterministic point id of a document in a collection."""
    return str(uuid.uuid5(POINT_ID_NAMESPACE, f"{collection}/{document_id}"))


def chunk_point_id(collection: str, document_id: str, index: int) -> str:
    """The point id of passage ``index`` of a document. Passage 0 keeps the document's
    own ``point_id``, so a document stored whole (before it was split, or because it
    fits) is replaced by its first passage, not duplicated; the others derive from
    that id as a namespace, which no document's own id can collide with."""
    own = point_id(collection, document_id)
    if index == 0:
        return own
    return str(uuid.uuid5(uuid.UUID(own), str(index)))


def _canonical_id(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidStoreRequest(f"point id {value!r} is not a UUID string") from exc


@dataclass(frozen=True, slots=True)
class Point:
    """One vector with its payload. ``id`` is a UUID string, kept in canonical form."""

    id: str
    vector: VectorLike
    payload: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", _canonical_id(self.id))


@dataclass(frozen=True, slots=True)
class Hit:
    id: str
    score: float
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CollectionSpec:
    """What a collection holds: which model's vectors, how long, compared how."""

    name: str
    dimension: int
    distance: Distance
    model: str


class VectorStore(Protocol):
    async def ensure_collection(
        self, name: str, dimension: int, distance: Distance, model: str
    ) -> CollectionSpec:
        """Create the collection on first use; refuse one of another model or shape."""
        ...

    async def upsert(self, collection: str, points: Sequence[Point]) -> None:
        """Insert or replace points by id; returns once the store has acknowledged them."""
        ...

    async def delete(self, collection: str, ids: Sequence[str]) -> None:
        """Delete points by id; ids that are not there are ignored."""
        ...

    async def delete_matching(self, collection: str, filter: PayloadFilter) -> None:
        """Delete every point whose payload matches ``filter`` (as ``search`` filters);
        none matching is no error. An empty filter is refused: it would match all."""
        ...

    async def search(
        self,
        collection: str,
        vector: VectorLike,
        limit: int = 10,
        filter: PayloadFilter | None = None,
    ) -> list[Hit]:
        """The ``limit`` nearest points matching ``filter``, best first, with payloads."""
        ...

    async def count(self, collection: str) -> int: ...

    async def describe(self, collection: str) -> CollectionSpec:
        """What an existing collection holds; ``CollectionNotFound`` if there is none."""
        ...

    async def retrieve(self, collection: str, ids: Sequence[str]) -> list[Point]:
        """Stored points with vectors, in the order asked; missing ids are left out."""
        ...

    async def close(self) -> None:
        """Release the engine; idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


# --- checks both implementations share, so both refuse the same inputs the same way ---


def check_open(store: Closable) -> None:
    if store.closed:
        raise StoreError("the vector store is closed")


def check_collection_name(name: str) -> str:
    if not isinstance(name, str) or not _COLLECTION_NAME.fullmatch(name):
        raise InvalidStoreRequest(
            f"collection name {name!r} must be 1-255 letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )
    return name


def check_spec(name: str, dimension: int, distance: str, model: str) -> CollectionSpec:
    check_collection_name(name)
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
        raise InvalidStoreRequest(f"dimension must be a positive int, got {dimension!r}")
    if distance not in DISTANCES:
        raise InvalidStoreRequest(f"distance must be one of {DISTANCES}, got {distance!r}")
    if not isinstance(model, str) or not model:
        raise InvalidStoreRequest("model must be a non-empty model name")
    return CollectionSpec(name=name, dimension=dimension, distance=distance, model=model)


def refuse_mismatch(existing: CollectionSpec, wanted: CollectionSpec) -> None:
    """Raise ``CollectionModelMismatch`` unless the collection holds what is wanted."""
    diffs = [
        f"{what} {have!r} (wanted {want!r})"
        for what, have, want in (
            ("model", existing.model, wanted.model),
            ("dimension", existing.dimension, wanted.dimension),
            ("distance", existing.distance, wanted.distance),
        )
        if have != want
    ]
    if diffs:
        raise CollectionModelMismatch(
            f"collection {existing.name!r} holds {', '.join(diffs)}; vectors of different"
            " models must not share a collection: re-embed into a new collection"
            " (for example one named after the model) or drop this one first"
        )


def as_vector(vector: VectorLike, dimension: int) -> list[float]:
    """A plain float list of the collection's length with finite values, or a 422."""
    try:
        array = np.asarray(vector, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidStoreRequest(f"vector is not a sequence of numbers: {exc}") from exc
    if array.ndim != 1 or array.shape[0] != dimension:
        raise InvalidStoreRequest(
            f"vector has shape {array.shape}, the collection holds {dimension}-d vectors"
        )
    if not np.isfinite(array).all():
        raise InvalidStoreRequest("vector has NaN or infinite values")
    values: list[float] = array.tolist()
    return values


def latest_by_id(points: Sequence[Point]) -> list[Point]:
    """One point per id, the last one given, so a batch with repeats acts like a sequence."""
    return list({p.id: p for p in points}.values())


def check_ids(ids: Sequence[str]) -> list[str]:
    if isinstance(ids, str):
        raise InvalidStoreRequest("ids must be a sequence of UUID strings, not one string")
    return [_canonical_id(i) for i in ids]


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidStoreRequest(f"limit must be a positive int, got {limit!r}")
    return limit


_INT64 = (-(2**63), 2**63 - 1)


def check_filter(filter: PayloadFilter | None) -> list[Condition]:
    """Validate the flat equality filter into conditions each engine translates."""
    if not filter:
        return []
    if not isinstance(filter, Mapping):
        raise InvalidStoreRequest("filter must be a mapping of payload path to value")
    conditions: list[Condition] = []
    for key, value in filter.items():
        if not isinstance(key, str) or not key:
            raise InvalidStoreRequest(f"filter key {key!r} must be a non-empty payload path")
        for number in value if isinstance(value, list | tuple) else (value,):
            if isinstance(number, int) and not _INT64[0] <= number <= _INT64[1]:
                raise InvalidStoreRequest(  # the engines match 64-bit integers only
                    f"filter {key!r}: {number} is outside the 64-bit integer range"
                )
        if isinstance(value, str | bool | int):
            conditions.append((key, value))
        elif isinstance(value, AtLeast):
            bound = value.value
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise InvalidStoreRequest(f"filter {key!r}: AtLeast needs an int, got {bound!r}")
            conditions.append((key, value))
        elif isinstance(value, list | tuple) and value:
            if all(isinstance(v, str) for v in value):
                conditions.append((key, [str(v) for v in value]))
            elif all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                conditions.append((key, [int(v) for v in value]))
            else:
                raise InvalidStoreRequest(f"filter {key!r}: a list must be all str or all int")
        else:
            raise InvalidStoreRequest(
                f"filter {key!r}: {value!r} ({type(value).__name__}) is not matchable;"
                " use a str, int, bool, AtLeast(int) or a non-empty list of str or of int"
            )
    return conditions


def check_delete_filter(filter: PayloadFilter) -> list[Condition]:
    """A filter that selects points to delete: checked, and never empty."""
    conditions = check_filter(filter)
    if not conditions:
        raise InvalidStoreRequest(
            "delete_matching needs a non-empty filter: an empty one would delete every point"
        )
    return conditions


# --- what the engines hand back, in the contract's values; both engines' records fit ---


class _Returned(Protocol):
    @property
    def id(self) -> object: ...
    @property
    def payload(self) -> dict[str, Any] | None: ...


class _Record(_Returned, Protocol):
    @property
    def vector(self) -> object: ...


class _Scored(_Returned, Protocol):
    @property
    def score(self) -> float: ...


def as_hits(found: Iterable[_Scored]) -> list[Hit]:
    return [Hit(id=str(p.id), score=p.score, payload=p.payload or {}) for p in found]


def in_asked_order(records: Iterable[_Record], ids: Sequence[str]) -> list[Point]:
    """The retrieved records as points in the order of ``ids``, each once; an id the
    engine did not return is left out."""
    found = {
        str(r.id): Point(id=str(r.id), vector=_as_float_list(r.vector), payload=r.payload or {})
        for r in records
    }
    return [found[i] for i in dict.fromkeys(ids) if i in found]


def _as_float_list(vector: object) -> list[float]:
    """The dense vector an engine handed back (unnamed vector only)."""
    if isinstance(vector, list) and all(isinstance(x, float | int) for x in vector):
        return [float(x) for x in vector]
    raise StoreError(f"engine returned a vector of unexpected form: {type(vector).__name__}")
