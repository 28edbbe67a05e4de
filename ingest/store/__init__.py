"""The vector store seam: open a store by kind; the contract's and errors' public names.

Two engines share one contract (``contract.py``, tested by
``tests/ingest/store/test_contract.py``):

- ``"qdrant"`` (``qdrant.QdrantStore``): a Qdrant server through ``qdrant-client``;
  its ``:memory:`` and ``path=`` local modes serve tests.
- ``"edge"`` (``edge.EdgeStore``): Qdrant's own engine in-process (``qdrant-edge-py``),
  persisted under a data directory; the one-machine default.

Choose an engine with ``open_store(kind, **options)``. Importing this package imports
neither engine: each opener imports its own when called, so a process that writes to a
Qdrant server never loads qdrant-edge, and the other way round. The engines import
``contract`` and ``errors`` directly, never this module; code outside the package
imports from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ingest.store.contract import (
    DISTANCES,
    POINT_ID_NAMESPACE,
    AtLeast,
    CollectionSpec,
    Distance,
    Hit,
    MatchValue,
    PayloadFilter,
    Point,
    VectorLike,
    VectorStore,
    chunk_point_id,
    point_id,
)
from ingest.store.errors import (
    CollectionModelMismatch,
    CollectionNotFound,
    InvalidStoreRequest,
    ShardLocked,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    records_fault,
)

__all__ = [
    "DISTANCES",
    "POINT_ID_NAMESPACE",
    "STORES",
    "AtLeast",
    "CollectionModelMismatch",
    "CollectionNotFound",
    "CollectionSpec",
    "Distance",
    "Hit",
    "InvalidStoreRequest",
    "MatchValue",
    "PayloadFilter",
    "Point",
    "ShardLocked",
    "StoreError",
    "StoreMisconfigured",
    "StoreUnavailable",
    "VectorLike",
    "VectorStore",
    "chunk_point_id",
    "open_store",
    "point_id",
    "records_fault",
]


def _open_qdrant(**options: Any) -> VectorStore:
    from ingest.store.qdrant import QdrantStore

    return QdrantStore(**options)


def _open_edge(**options: Any) -> VectorStore:
    from ingest.store.edge import EdgeStore

    return EdgeStore(**options)


STORES: dict[str, Callable[..., VectorStore]] = {
    "qdrant": _open_qdrant,
    "edge": _open_edge,
}


def open_store(kind: str, **options: Any) -> VectorStore:
    """Open a store by kind: ``open_store("edge", data_dir=...)``,
    ``open_store("qdrant", url=..., api_key=...)`` or ``open_store("qdrant", location=":memory:")``.
    """
    try:
        opener = STORES[kind]
    except KeyError:
        raise InvalidStoreRequest(
            f"unknown vector store {kind!r}; choose one of {sorted(STORES)}"
        ) from None
    return opener(**options)
