"""The FastAPI app: thin handlers over ``Gateway``, the error handlers
(``gateway.handlers``), probes and metrics; the OpenAPI document of each route comes
from ``gateway.openapi``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from embedder.core.adapters import AdapterCatalog
from embedder.core.fleet import FleetAdmin, FleetView
from embedder.core.jobs import ModelStates, Task
from embedder.queue import JobSubmitter
from embedder.tasks.registry import routes
from gateway import handlers, metrics
from gateway.admin import add_admin_routes
from gateway.answers import IngestReadiness, Readiness
from gateway.config import GatewayConfig
from gateway.documents import add_document_routes
from gateway.generate import GenerateRoute
from gateway.ocr import OcrRoute
from gateway.openapi import ApiDocs
from gateway.schemas import DOCUMENTED, SEARCH
from gateway.search import CollectionSearch
from gateway.service import Gateway, ShapeRoute
from ingest.health import IngestHealth
from ingest.pipeline import IngestCore
from ingest.store import VectorStore

# The routes whose task annotates its own way; every other kind's routes are ShapeRoutes.
ROUTE_OF_TASK: dict[str, Callable[[str], ShapeRoute | GenerateRoute | OcrRoute]] = {
    Task.GENERATE.value: GenerateRoute,
    Task.OCR.value: OcrRoute,
}


def body_routes() -> dict[str, str]:
    """Every task kind's routes (embedder.tasks.registry): path -> API shape."""
    return {path: shape for path, (_, shape) in routes().items()}


def create_app(
    config: GatewayConfig,
    fleet: FleetView,
    queue: JobSubmitter,
    states: ModelStates,
    lifespan: Callable[[FastAPI], object] | None = None,
    store: VectorStore | None = None,
    adapters: AdapterCatalog | None = None,
    ingest: IngestCore | None = None,
    ingest_health: IngestHealth | None = None,
    admin: FleetAdmin | None = None,
) -> FastAPI:
    """The API over ``fleet`` and ``queue``; with ``admin``, the admin API that adds and
    removes models (``gateway.admin``), open to --admin-keys."""
    app = FastAPI(title="flotilla", version=config.version, lifespan=lifespan)  # type: ignore[arg-type]
    gateway = Gateway(config, fleet, queue, states, adapters=adapters)
    app.state.gateway = gateway
    handlers.install(app)
    docs = ApiDocs()
    _add_task_routes(app, gateway, docs)
    if store is not None:
        _add_search_route(app, gateway, store, docs)
    if ingest is not None:  # the process that owns the store takes documents for it
        add_document_routes(app, gateway, ingest, docs)
    if admin is not None:
        add_admin_routes(app, gateway, admin, docs)
    _add_model_list(app, fleet, states, gateway.adapters)
    _add_probes(app, fleet, states, ingest_health)
    _add_metrics(app, fleet, queue)
    docs.install(app)
    return app


def _add_task_routes(app: FastAPI, gateway: Gateway, docs: ApiDocs) -> None:
    """Every task kind's routes, each documented where its shape has a schema."""

    def handler(task: str, shape: str) -> Callable[[Request], Awaitable[Response]]:
        route = ROUTE_OF_TASK.get(task, ShapeRoute)(shape)

        async def handle(request: Request) -> Response:
            return await gateway.handle(request, route)

        handle.__name__ = str(shape)
        return handle

    for path, (kind, shape) in routes().items():
        documented = DOCUMENTED.get(shape)
        app.add_api_route(
            path, handler(kind.name, shape), methods=["POST"], response_class=Response,
            **(docs.route(path, documented) if documented is not None else {}),
        )  # fmt: skip


def _add_search_route(app: FastAPI, gateway: Gateway, store: VectorStore, docs: ApiDocs) -> None:
    search = "/v1/collections/{name}/search"

    @app.post(search, response_class=Response, **docs.route(search, SEARCH))
    async def collection_search(
        request: Request, name: Annotated[str, Path(examples=["documents"])]
    ) -> Response:
        return await gateway.handle(request, CollectionSearch(store, name))


def _add_model_list(
    app: FastAPI, fleet: FleetView, states: ModelStates, catalog: AdapterCatalog
) -> None:
    @app.get("/v1/models")
    async def list_models() -> dict[str, object]:
        """Every model, then each of its adapters as 'model:adapter' with the model as
        parent (as vLLM lists LoRA modules)."""
        data: list[dict[str, object]] = []
        for name, spec in fleet.models.items():
            common = {"object": "model", "created": 0, "owned_by": "flotilla"}
            state = states.state(name)
            data.append(
                {
                    "id": name,
                    **common,
                    "task": spec.task,
                    "aliases": list(spec.aliases),
                    "state": state,
                    **states.describe(name),
                }
            )
            data += [
                {"id": f"{name}:{adapter}", **common, "parent": name, "root": name,
                 "task": spec.task, "state": state, "adapter": adapter}
                for adapter in sorted(catalog.names(name))
            ]  # fmt: skip
        return {"object": "list", "data": data}


READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": Readiness},
    503: {"model": Readiness, "description": "Some model is still loading, or failed to load."},
}
INGEST_READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": IngestReadiness},
    503: {
        "model": IngestReadiness,
        "description": "Ingest is starting, waiting on an unavailable store, restarting "
        "after a failure, or stopped.",
    },
}


def _add_probes(
    app: FastAPI, fleet: FleetView, states: ModelStates, ingest_health: IngestHealth | None
) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/ready", response_model=None, responses=READY_RESPONSES)
    async def ready() -> Response:
        """Readiness to serve requests: every model of the fleet is loaded, or loads on
        its first request (an on-demand model, resident or evicted). Ingest, when
        this process runs it, is reported beside (status 'degraded' while it is not
        running) without failing the probe: a Kafka outage must not take the API of
        every replica out of its load balancer. /ready/ingest is ingest's own probe."""
        model_states = {name: states.state(name) for name in fleet.models}
        ok = all(state in ("ready", "evicted") for state in model_states.values())
        body: dict[str, object] = {"status": "ready" if ok else "not_ready", "models": model_states}
        if ingest_health is not None:
            ingest_status = ingest_health.status()
            body["ingest"] = ingest_status.describe()
            if ok and not ingest_status.up:
                body["status"] = "degraded"
        return JSONResponse(body, status_code=200 if ok else 503)

    if ingest_health is None:
        return
    kafka_ingest = ingest_health  # narrowed for the handler below

    @app.get("/ready/ingest", response_model=None, responses=INGEST_READY_RESPONSES)
    async def ready_ingest() -> Response:
        """Ingest's probe: 200 while it consumes, 503 while it starts, restarts or has
        failed (the body says why)."""
        ingest_status = kafka_ingest.status()
        return JSONResponse(ingest_status.describe(), status_code=200 if ingest_status.up else 503)


def _add_metrics(app: FastAPI, fleet: FleetView, queue: JobSubmitter) -> None:
    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> Response:
        depth = queue.depth()
        for name in fleet.models:
            metrics.QUEUE_DEPTH.labels(name).set(depth.get(name, 0))
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
