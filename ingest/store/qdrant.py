"""The Qdrant server path: ``VectorStore`` over ``qdrant-client``'s ``AsyncQdrantClient``.

``QdrantStore(url=..., api_key=...)`` talks to a server over REST (or gRPC with
``prefer_grpc=True``); an https URL is verified against ``ca_file`` (the system's trust
store without one) and may show a client certificate (``qdrant_tls``). Entering the store
(``async with``, or ``start``) calls the server once: a URL, CA or client certificate that
does not fit it fails there (``StoreMisconfigured``, naming the setting), while a server
that is merely down is logged and waited out by the writes' retries.
``QdrantStore(location=":memory:")`` and ``QdrantStore(path=...)`` are qdrant-client's
local modes: pure-Python brute force that runs on the event loop itself, fine for tests
and a few thousand points, not for production.

The embedding model is recorded in the collection's own metadata (``flotilla_model``);
dimension and distance are read back from the collection's vector config.

Transport failures, timeouts, 429 and 5xx answers become ``StoreUnavailable`` so the
pipeline backs off and retries; 404 becomes ``CollectionNotFound``; 400/422 become
``InvalidStoreRequest``; anything else is a non-retriable ``StoreError``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
from qdrant_client import AsyncQdrantClient, models
from qdrant_client.common.client_exceptions import ResourceExhaustedResponse
from qdrant_client.common.version_check import is_compatible
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from embedder.core.lifecycle import Closable
from ingest.store.contract import (
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
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    classified,
)
from ingest.store.qdrant_tls import misconfigured, tls_context

log = logging.getLogger(__name__)

MODEL_KEY = "flotilla_model"

_DISTANCE: dict[Distance, models.Distance] = {
    "cosine": models.Distance.COSINE,
    "dot": models.Distance.DOT,
    "euclid": models.Distance.EUCLID,
    "manhattan": models.Distance.MANHATTAN,
}
_DISTANCE_BACK: dict[models.Distance, Distance] = {v: k for k, v in _DISTANCE.items()}

_UNAVAILABLE_GRPC = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
}


class QdrantStore(Closable):
    """A ``VectorStore`` on a Qdrant server (or qdrant-client's local mode for tests)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        api_key: str | None = None,
        ca_file: Path | None = None,
        client_cert: Path | None = None,
        client_key: Path | None = None,
        location: str | None = None,
        path: str | None = None,
        prefer_grpc: bool = False,
        timeout_s: int | None = None,
        check_compatibility: bool = True,
    ) -> None:
        if sum(x is not None for x in (url, location, path)) != 1:
            raise InvalidStoreRequest(
                "give exactly one of url (a server), location (':memory:') or path (local files)"
            )
        tls = {"ca_file": ca_file, "client_cert": client_cert, "client_key": client_key}
        if prefer_grpc and any(v is not None for v in tls.values()):
            raise InvalidStoreRequest(
                "qdrant-client's gRPC channel takes no CA file or client certificate: use REST"
            )
        self._tls = None if url is None or prefer_grpc else tls_context(url, **tls)
        self._url = url
        self._probe = url is not None and not prefer_grpc  # the probe speaks TCP to REST's port
        self._client_cert = client_cert is not None
        self._check_compatibility = check_compatibility
        self._client = AsyncQdrantClient(
            location=location,
            url=url,
            path=path,
            api_key=api_key,
            prefer_grpc=prefer_grpc,
            timeout=timeout_s,
            # Checked in start() instead: the client's own check runs on a thread of its
            # own with httpx's defaults, which neither know the CA nor show the certificate.
            check_compatibility=False,
            **_rest_options(self._tls),
        )
        self._specs: dict[str, CollectionSpec] = {}

    async def start(self) -> None:
        """On a server: call it once, so that settings that do not fit it fail here,
        named, rather than as a retried write (the store is closed then: no use of it
        could succeed); a server that is down is only logged."""
        check_open(self)
        if self._url is None:
            return
        try:
            info = await self._client.info()
            await self._client.get_collections()  # the root may answer without the API key
        except Exception as exc:
            refused = _classify(exc, None)
            if isinstance(refused, StoreMisconfigured):  # the API key
                await self.close()
                raise refused from exc
            problem = None
            if self._probe:
                problem = await misconfigured(self._url, self._tls, client_cert=self._client_cert)
            if problem is not None:
                await self.close()
                raise StoreMisconfigured(problem) from exc
            log.warning(
                "the Qdrant server at %s does not answer yet (%s); writes retry until it does",
                self._url,
                _classify(exc, None).message,
            )
            return
        client = importlib.metadata.version("qdrant-client")
        if self._check_compatibility and not is_compatible(client, info.version):
            log.warning(
                "the Qdrant server at %s is version %s; qdrant-client %s speaks to servers of "
                "its major version within one minor version",
                self._url,
                info.version,
                client,
            )

    async def ensure_collection(
        self, name: str, dimension: int, distance: Distance, model: str
    ) -> CollectionSpec:
        wanted = check_spec(name, dimension, distance, model)
        check_open(self)
        with classified(_classify, name):
            if not await self._client.collection_exists(name):
                try:
                    await self._client.create_collection(
                        name,
                        vectors_config=models.VectorParams(
                            size=dimension, distance=_DISTANCE[distance]
                        ),
                        metadata={MODEL_KEY: model},
                    )
                except (UnexpectedResponse, ValueError) as exc:
                    # Another writer created it first; what it holds is checked below.
                    if not _already_exists(exc):
                        raise
            existing = await self._describe(name)
        refuse_mismatch(existing, wanted)
        self._specs[name] = existing
        return existing

    async def upsert(self, collection: str, points: Sequence[Point]) -> None:
        spec = await self._spec(collection)
        points = latest_by_id(points)
        if not points:
            return
        batch = models.Batch(
            ids=[p.id for p in points],
            vectors=[as_vector(p.vector, spec.dimension) for p in points],
            payloads=[dict(p.payload) for p in points],
        )
        with classified(_classify, collection):
            await self._client.upsert(collection, points=batch, wait=True)

    async def delete(self, collection: str, ids: Sequence[str]) -> None:
        await self._spec(collection)
        wanted = check_ids(ids)
        if not wanted:
            return
        with classified(_classify, collection):
            await self._client.delete(
                collection, points_selector=models.PointIdsList(points=list(wanted)), wait=True
            )

    async def delete_matching(self, collection: str, filter: PayloadFilter) -> None:
        await self._spec(collection)
        selected = _to_filter(check_delete_filter(filter))
        assert selected is not None  # check_delete_filter refuses an empty filter
        with classified(_classify, collection):
            await self._client.delete(
                collection, points_selector=models.FilterSelector(filter=selected), wait=True
            )

    async def search(
        self,
        collection: str,
        vector: VectorLike,
        limit: int = 10,
        filter: PayloadFilter | None = None,
    ) -> list[Hit]:
        spec = await self._spec(collection)
        query = as_vector(vector, spec.dimension)
        limit = check_limit(limit)
        conditions = check_filter(filter)
        with classified(_classify, collection):
            response = await self._client.query_points(
                collection,
                query=query,
                limit=limit,
                query_filter=_to_filter(conditions),
                with_payload=True,
                with_vectors=False,
            )
        return as_hits(response.points)

    async def count(self, collection: str) -> int:
        await self._spec(collection)
        with classified(_classify, collection):
            result = await self._client.count(collection, exact=True)
        return result.count

    async def retrieve(self, collection: str, ids: Sequence[str]) -> list[Point]:
        await self._spec(collection)
        wanted = check_ids(ids)
        if not wanted:
            return []
        with classified(_classify, collection):
            records = await self._client.retrieve(
                collection, ids=wanted, with_payload=True, with_vectors=True
            )
        return in_asked_order(records, wanted)

    async def _release(self) -> None:
        with classified(_classify, None):
            await self._client.close()

    async def describe(self, collection: str) -> CollectionSpec:
        """What an existing collection holds (``CollectionNotFound`` if none); read
        fresh, since another writer may have created it."""
        check_collection_name(collection)
        check_open(self)
        with classified(_classify, collection):
            return await self._describe(collection)

    async def _spec(self, collection: str) -> CollectionSpec:
        """The collection's spec: remembered from ``ensure_collection`` or read once."""
        check_collection_name(collection)
        check_open(self)
        spec = self._specs.get(collection)
        if spec is None:
            with classified(_classify, collection):
                spec = await self._describe(collection)
            self._specs[collection] = spec
        return spec

    async def _describe(self, name: str) -> CollectionSpec:
        info = await self._client.get_collection(name)
        vectors = info.config.params.vectors
        if not isinstance(vectors, models.VectorParams):
            raise CollectionModelMismatch(
                f"collection {name!r} has named or no dense vectors; flotilla writes one"
                " unnamed vector per point: re-embed into a new collection"
            )
        metadata: dict[str, Any] = info.config.metadata or {}
        model = metadata.get(MODEL_KEY)
        return CollectionSpec(
            name=name,
            dimension=vectors.size,
            distance=_DISTANCE_BACK[vectors.distance],
            model=model if isinstance(model, str) else "(none recorded)",
        )


def _rest_options(tls: ssl.SSLContext | None) -> dict[str, Any]:
    """What qdrant-client passes on to httpx: the TLS context as its ``verify``."""
    return {} if tls is None else {"verify": tls}


def _to_filter(conditions: list[Condition]) -> models.Filter | None:
    if not conditions:
        return None
    must: list[models.Condition] = []
    for key, value in conditions:
        if isinstance(value, AtLeast):
            must.append(models.FieldCondition(key=key, range=models.Range(gte=value.value)))
            continue
        match: models.MatchValue | models.MatchAny = (
            models.MatchAny(any=value)
            if isinstance(value, list)
            else models.MatchValue(value=value)
        )
        must.append(models.FieldCondition(key=key, match=match))
    return models.Filter(must=must)


def _already_exists(exc: Exception) -> bool:
    if isinstance(exc, UnexpectedResponse):
        return exc.status_code == 409
    return "already exists" in str(exc)


def _classify(exc: Exception, collection: str | None) -> StoreError:
    """What qdrant-client raised, as one of the store's classified errors."""
    where = f"Qdrant (collection {collection!r})" if collection else "Qdrant"
    if isinstance(exc, ResourceExhaustedResponse):
        return StoreUnavailable(
            f"{where} is rate limiting: {exc}", retry_after_s=max(1, int(exc.retry_after_s))
        )
    if isinstance(exc, ResponseHandlingException):
        source = exc.source
        if isinstance(source, httpx.TransportError | OSError | TimeoutError):
            return StoreUnavailable(f"{where} unreachable: {type(source).__name__}: {source}")
        return StoreError(f"{where} sent an unreadable answer: {source}")
    if isinstance(exc, UnexpectedResponse):
        return _classify_status(exc, where)
    if isinstance(exc, grpc.RpcError):
        return _classify_grpc(exc, where)
    if isinstance(exc, httpx.TransportError | ConnectionError | TimeoutError):
        return StoreUnavailable(f"{where} unreachable: {type(exc).__name__}: {exc}")
    if isinstance(exc, ValueError):
        # The local modes raise ValueError for what a server answers with 404 or 400.
        if "not found" in str(exc):
            return CollectionNotFound(f"{where}: {exc}")
        return InvalidStoreRequest(f"{where} refused the request: {exc}")
    return StoreError(f"{where} failed: {type(exc).__name__}: {exc}")


def _classify_status(exc: UnexpectedResponse, where: str) -> StoreError:
    """An HTTP answer Qdrant sent, by its status."""
    status = exc.status_code or 0
    detail = exc.content[:300].decode("utf-8", "replace")
    if status == 404:
        return CollectionNotFound(f"{where}: not found ({detail})")
    if status in (401, 403):  # the key, not the records: nothing may be dead-lettered for it
        return StoreMisconfigured(
            f"{where} refused this client's API key ({status}): check --qdrant-api-key "
            "(FLOTILLA_QDRANT_API_KEY)"
        )
    if status in (400, 413, 422):
        return InvalidStoreRequest(f"{where} refused the request: {detail}")
    if status == 429 or status >= 500:
        return StoreUnavailable(f"{where} answered {status}: {detail}")
    return StoreError(f"{where} answered {status}: {detail}")


def _classify_grpc(exc: grpc.RpcError, where: str) -> StoreError:
    """A gRPC call that failed, by its status code."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    if code in _UNAVAILABLE_GRPC:
        return StoreUnavailable(f"{where} unavailable over gRPC: {code}")
    if code == grpc.StatusCode.NOT_FOUND:
        return CollectionNotFound(f"{where}: not found")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidStoreRequest(f"{where} refused the request: {exc}")
    return StoreError(f"{where} failed over gRPC: {code}")
