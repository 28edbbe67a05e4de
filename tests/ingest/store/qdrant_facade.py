"""One process owns the edge shards and speaks a sliver of Qdrant's REST API over them.

**A test service.** An embedded qdrant-edge shard belongs to one process, and a Qdrant
server is not installable on the build machines. This service hosts an ``EdgeStore``
and answers exactly the requests ``QdrantStore(url=...)`` (qdrant-client 1.20's
``AsyncQdrantClient`` over REST) sends, so the tests run the Qdrant server path, and
several processes on one machine (ingest workers the tests kill) write into one
collection::

    python -m tests.ingest.store.qdrant_facade --data-dir vectors/ --port 6333
    QdrantStore(url="http://127.0.0.1:6333")

Nothing in flotilla starts it; ``open_store`` does not open it. The tests start it
through ``tests/ingest/store/server_fixture.py``.

**TLS** as a Qdrant server configured for it: ``--ssl-certfile`` and ``--ssl-keyfile``
serve https (uvicorn's own TLS), and ``--ssl-client-ca`` requires client certificates
issued by that CA.

**It is NOT a Qdrant replacement.** No auth, no gRPC, no snapshots, no HNSW, no
named vectors, no payload indexes; filters are ``must`` lists of ``match`` conditions
and ``range`` conditions with ``gte`` only. Anything else is refused (422), never silently ignored.
Bind it to loopback; production uses a real Qdrant server.

Endpoints: ``GET /`` (version: qdrant-client warns unless the server's major.minor is
within one minor of its own), ``GET /healthz``, ``GET /collections/{c}/exists``,
``GET|PUT /collections/{c}``, and under ``/collections/{c}/points``: ``PUT`` (upsert),
``POST`` (retrieve), ``POST .../delete`` (by ids or by filter), ``POST .../query``,
``POST .../count``.

**The model guard** holds through the facade: a collection is created with its model
in ``metadata.flotilla_model`` (kept in the EdgeStore's sidecar and read back by
``GET /collections/{c}``), so ``QdrantStore.ensure_collection`` refuses another model
exactly as against a server. The collection config beyond vectors and metadata is
placeholder values that satisfy the client's response models.

**Durability** is the EdgeStore's: an upsert is answered once it is in the shard's WAL,
so acknowledged points survive a SIGKILL of this process (tested). ``wait=false`` is
treated as ``wait=true``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import pydantic_core
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError

from ingest.store.contract import AtLeast, Distance, MatchValue, PayloadFilter, Point
from ingest.store.edge import EdgeStore
from ingest.store.errors import CollectionNotFound, InvalidStoreRequest, StoreError

# The API version whose request and response shapes this speaks; qdrant-client 1.20
# (pinned) accepts servers 1.19-1.21 without a warning.
QDRANT_API_VERSION = "1.20.0"
# Where QdrantStore records the model; ingest.store.qdrant.MODEL_KEY (a test pins them
# equal; importing it would load qdrant-client into this process for one string).
MODEL_KEY = "flotilla_model"

_DISTANCES: dict[str, Distance] = {
    "Cosine": "cosine",
    "Dot": "dot",
    "Euclid": "euclid",
    "Manhattan": "manhattan",
}
_QDRANT_DISTANCE = {v: k for k, v in _DISTANCES.items()}

log = logging.getLogger(__name__)


class CollectionExists(StoreError):
    http_status = 409
    code = "collection_exists"


# --- the request bodies qdrant-client writes; unknown fields are refused, not ignored ---


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VectorParams(_Body):
    size: int
    distance: str


class CreateCollection(_Body):
    vectors: VectorParams
    metadata: dict[str, Any] = {}


class Batch(_Body):
    ids: list[str]
    vectors: list[list[float]]
    payloads: list[dict[str, Any] | None] | None = None


class PointStruct(_Body):
    id: str
    vector: list[float]
    payload: dict[str, Any] | None = None


class UpsertPoints(_Body):
    batch: Batch | None = None
    points: list[PointStruct] | None = None


class PointRequest(_Body):
    ids: list[str]
    with_payload: bool = True
    with_vector: bool = False


class Match(_Body):
    value: str | int | bool | None = None
    any: list[str] | list[int] | None = None


class Range(_Body):
    """Only a lower bound: what the store's ``AtLeast`` sends."""

    gte: float
    gt: None = None
    lt: None = None
    lte: None = None


class FieldCondition(_Body):
    key: str
    match: Match | None = None
    range: Range | None = None


class Filter(_Body):
    must: list[FieldCondition] = []


class NearestQuery(_Body):
    nearest: list[float]


class QueryRequest(_Body):
    query: NearestQuery | list[float]
    filter: Filter | None = None
    limit: int = 10
    with_payload: bool = False
    with_vector: Literal[False] = False


class CountRequest(_Body):
    exact: bool = True


class DeletePoints(_Body):
    """Qdrant's points selector: ids (``PointIdsList``) or a filter (``FilterSelector``)."""

    points: list[str] | None = None
    filter: Filter | None = None


def payload_filter(body: Filter | None) -> PayloadFilter:
    """The store's flat filter from Qdrant's ``{"must": [{"key", "match"}]}``."""
    flat: dict[str, MatchValue | list[str] | list[int] | AtLeast] = {}
    for cond in body.must if body else []:
        if cond.key in flat:
            raise InvalidStoreRequest(f"filter: one condition per key, {cond.key!r} repeats")
        if (cond.match is None) == (cond.range is None):
            raise InvalidStoreRequest(f"filter {cond.key!r}: give one of match or range")
        if cond.range is not None:
            if not cond.range.gte.is_integer():
                raise InvalidStoreRequest(f"filter {cond.key!r}: range gte must be a whole number")
            flat[cond.key] = AtLeast(int(cond.range.gte))
            continue
        assert cond.match is not None
        value, any_of = cond.match.value, cond.match.any
        if value is not None and any_of is None:
            flat[cond.key] = value
        elif any_of is not None and value is None:
            flat[cond.key] = any_of
        else:
            raise InvalidStoreRequest(f"filter {cond.key!r}: match needs one of value or any")
    return flat


B = TypeVar("B", bound=_Body)


async def _parse(request: Request, model: type[B]) -> B:
    """The body, parsed and checked by pydantic in one pass: on batches of vectors this is
    about five times faster than FastAPI's ``json.loads`` then validation."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise InvalidStoreRequest(
            f"Format error in JSON body (or unsupported here): {problems}"
        ) from None


class _Json(JSONResponse):
    def render(self, content: Any) -> bytes:
        return pydantic_core.to_json(content)  # ~10x json.dumps on vectors


def _ok(result: object, started: float) -> Response:
    return _Json({"result": result, "status": "ok", "time": time.perf_counter() - started})


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return _Json({"status": {"error": message}, "time": 0.0}, status_code=status, headers=headers)


def create_app(data_dir: str | Path) -> FastAPI:
    """The facade over an ``EdgeStore`` on ``data_dir``; run it in exactly one process."""
    store = EdgeStore(data_dir)
    creating = asyncio.Lock()  # "exists? then create" must not interleave

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await store.close()  # flushes; a SIGKILL skips it and loses nothing acknowledged

    app = FastAPI(title="flotilla store server", lifespan=lifespan)

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StoreError)
        if exc.http_status >= 500:
            log.warning("store error: %s", exc.message)
        return _error(exc.http_status, exc.message, exc.headers)

    async def exists(name: str) -> bool:
        try:
            await store.describe(name)
        except CollectionNotFound:
            return False
        return True

    @app.get("/")
    async def version() -> dict[str, str]:
        return {
            "title": "flotilla store server (a Qdrant REST subset)",
            "version": QDRANT_API_VERSION,
        }

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "healthz check passed"

    @app.get("/collections")
    async def list_collections() -> Response:
        """Qdrant's listing: the collections described under the data folder (the
        store's layout, ``ingest.store.edge``); a client's reachability probe asks it."""
        started = time.perf_counter()
        described = await asyncio.to_thread(lambda: list(Path(data_dir).glob("*/collection.json")))
        names = sorted(path.parent.name for path in described)
        return _ok({"collections": [{"name": name} for name in names]}, started)

    @app.get("/collections/{name}/exists")
    async def collection_exists(name: str) -> Response:
        started = time.perf_counter()
        return _ok({"exists": await exists(name)}, started)

    @app.get("/collections/{name}")
    async def get_collection(name: str) -> Response:
        started = time.perf_counter()
        spec = await store.describe(name)
        points = await store.count(name)
        config = {
            "params": {
                "vectors": {"size": spec.dimension, "distance": _QDRANT_DISTANCE[spec.distance]}
            },
            "hnsw_config": {"m": 16, "ef_construct": 100, "full_scan_threshold": 10000},
            "optimizer_config": {"default_segment_number": 1, "flush_interval_sec": 5},
            "metadata": {MODEL_KEY: spec.model},
        }
        info = {
            "status": "green",
            "optimizer_status": "ok",
            "points_count": points,
            "indexed_vectors_count": 0,
            "segments_count": 1,
            "config": config,
            "payload_schema": {},
        }
        return _ok(info, started)

    @app.put("/collections/{name}")
    async def create_collection(name: str, request: Request) -> Response:
        started = time.perf_counter()
        body = await _parse(request, CreateCollection)
        model = body.metadata.get(MODEL_KEY)
        if not isinstance(model, str) or set(body.metadata) != {MODEL_KEY}:
            raise InvalidStoreRequest(
                f"metadata must be exactly {{{MODEL_KEY!r}: <model name>}}: this server keeps"
                " only the embedding model of a collection"
            )
        distance = _DISTANCES.get(body.vectors.distance)
        if distance is None:
            raise InvalidStoreRequest(f"distance must be one of {sorted(_DISTANCES)}")
        async with creating:
            if await exists(name):
                raise CollectionExists(f"Wrong input: Collection `{name}` already exists!")
            await store.ensure_collection(name, body.vectors.size, distance, model)
        return _ok(True, started)

    @app.put("/collections/{name}/points")
    async def upsert_points(name: str, request: Request) -> Response:
        started = time.perf_counter()
        body = await _parse(request, UpsertPoints)
        if body.batch is not None and body.points is None:
            ids, vectors = body.batch.ids, body.batch.vectors
            payloads = body.batch.payloads or [None] * len(ids)
            if not len(ids) == len(vectors) == len(payloads):
                raise InvalidStoreRequest("batch: ids, vectors and payloads differ in length")
            points = [Point(i, v, p or {}) for i, v, p in zip(ids, vectors, payloads, strict=True)]
        elif body.points is not None and body.batch is None:
            points = [Point(p.id, p.vector, p.payload or {}) for p in body.points]
        else:
            raise InvalidStoreRequest("give exactly one of batch or points")
        await store.upsert(name, points)
        return _ok({"status": "completed"}, started)

    @app.post("/collections/{name}/points/delete")
    async def delete_points(name: str, request: Request) -> Response:
        started = time.perf_counter()
        body = await _parse(request, DeletePoints)
        if body.points is not None and body.filter is None:
            await store.delete(name, body.points)
        elif body.filter is not None and body.points is None:
            await store.delete_matching(name, payload_filter(body.filter))
        else:
            raise InvalidStoreRequest("give exactly one of points or filter")
        return _ok({"status": "completed"}, started)

    @app.post("/collections/{name}/points")
    async def get_points(name: str, request: Request) -> Response:
        started = time.perf_counter()
        body = await _parse(request, PointRequest)
        records = [
            {
                "id": p.id,
                "payload": p.payload if body.with_payload else None,
                "vector": p.vector if body.with_vector else None,
            }
            for p in await store.retrieve(name, body.ids)
        ]
        return _ok(records, started)

    @app.post("/collections/{name}/points/query")
    async def query_points(name: str, request: Request) -> Response:
        started = time.perf_counter()
        body = await _parse(request, QueryRequest)
        vector = body.query.nearest if isinstance(body.query, NearestQuery) else body.query
        hits = await store.search(name, vector, body.limit, payload_filter(body.filter))
        found = [
            {
                "id": h.id,
                "version": 0,
                "score": h.score,
                "payload": h.payload if body.with_payload else None,
            }
            for h in hits
        ]
        return _ok({"points": found}, started)

    @app.post("/collections/{name}/points/count")
    async def count_points(name: str, request: Request) -> Response:
        started = time.perf_counter()
        await _parse(request, CountRequest)  # refuses a filter: counts are exact and total
        return _ok({"count": await store.count(name)}, started)

    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.ingest.store.qdrant_facade",
        description="Serve an edge vector store to this machine's processes over a subset of"
        " Qdrant's REST API (not a Qdrant replacement: no auth; bind to loopback).",
    )
    parser.add_argument("--data-dir", type=Path, required=True, help="the EdgeStore's directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6333)
    parser.add_argument("--log-level", default="warning")
    # TLS, as a Qdrant server configured for it: its certificate and key, and the CA that
    # client certificates must chain to (given, a client without one is refused).
    parser.add_argument("--ssl-certfile", type=Path)
    parser.add_argument("--ssl-keyfile", type=Path)
    parser.add_argument("--ssl-client-ca", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    uvicorn.run(
        create_app(args.data_dir),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        ssl_ca_certs=args.ssl_client_ca,
        ssl_cert_reqs=ssl.CERT_REQUIRED if args.ssl_client_ca else ssl.CERT_NONE,
    )


if __name__ == "__main__":
    main()
