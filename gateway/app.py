"""The FastAPI app: thin handlers over ``Gateway``, the error handlers
(``gateway.handlers``), probes and metrics; the OpenAPI document of each route comes
from ``gateway.openapi``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from embedder.core.adapters import AdapterCatalog
from embedder.core.fleet import Fleet
from embedder.core.jobs import TASK_OF_SHAPE, ApiShape, ModelStates, Task
from embedder.queue import JobSubmitter
from gateway import handlers, metrics
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

ROUTES: dict[str, ApiShape] = {
    # TEI answers at its root; huggingface_hub posts feature_extraction and
    # sentence_similarity there
    "/": ApiShape.TEI_ROOT,
    "/v1/embeddings": ApiShape.OPENAI_EMBEDDINGS,
    "/embed": ApiShape.TEI_EMBED,
    "/similarity": ApiShape.TEI_SIMILARITY,
    "/rerank": ApiShape.TEI_RERANK,
    "/v1/rerank": ApiShape.COHERE_RERANK,
    "/v2/embed": ApiShape.COHERE_EMBED_V2,
    "/v2/rerank": ApiShape.COHERE_RERANK_V2,
    "/v1/chat/completions": ApiShape.OPENAI_CHAT,
    "/v1/completions": ApiShape.OPENAI_COMPLETIONS,
    "/v1/ocr": ApiShape.MISTRAL_OCR,
}
# The routes whose task annotates its own way; every other shape is a ShapeRoute.
ROUTE_OF_TASK: dict[Task, Callable[[ApiShape], ShapeRoute | GenerateRoute | OcrRoute]] = {
    Task.GENERATE: GenerateRoute,
    Task.OCR: OcrRoute,
}


def create_app(
    config: GatewayConfig,
    fleet: Fleet,
    queue: JobSubmitter,
    states: ModelStates,
    lifespan: Callable[[FastAPI], object] | None = None,
    store: VectorStore | None = None,
    adapters: AdapterCatalog | None = None,
    ingest: IngestCore | None = None,
    ingest_health: IngestHealth | None = None,
) -> FastAPI:
    app = FastAPI(title="flotilla", version=config.version, lifespan=lifespan)  # type: ignore[arg-type]
    gateway = Gateway(config, fleet, queue, states, adapters=adapters)
    catalog = gateway.adapters
    app.state.gateway = gateway
    handlers.install(app)
    docs = ApiDocs()

    def handler(shape: ApiShape) -> Callable[[Request], Awaitable[Response]]:
        route = ROUTE_OF_TASK.get(TASK_OF_SHAPE[shape], ShapeRoute)(shape)

        async def handle(request: Request) -> Response:
            return await gateway.handle(request, route)

        handle.__name__ = shape.value
        return handle

    for path, shape in ROUTES.items():
        app.add_api_route(
            path, handler(shape), methods=["POST"], response_class=Response,
            **docs.route(path, DOCUMENTED[shape]),
        )  # fmt: skip

    if store is not None:
        search_store = store  # narrowed for the handler below
        search = "/v1/collections/{name}/search"

        @app.post(search, response_class=Response, **docs.route(search, SEARCH))
        async def collection_search(
            request: Request, name: Annotated[str, Path(examples=["documents"])]
        ) -> Response:
            return await gateway.handle(request, CollectionSearch(search_store, name))

    if ingest is not None:  # the process that owns the store takes documents for it
        add_document_routes(app, gateway, ingest, docs)

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
                    "task": spec.task.value,
                    "aliases": list(spec.aliases),
                    "state": state,
                    **states.describe(name),
                }
            )
            data += [
                {"id": f"{name}:{adapter}", **common, "parent": name, "root": name,
                 "task": spec.task.value, "state": state, "adapter": adapter}
                for adapter in sorted(catalog.names(name))
            ]  # fmt: skip
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get(
        "/ready",
        response_model=None,
        responses={
            200: {"model": Readiness},
            503: {
                "model": Readiness,
                "description": "Some model is still loading, or failed to load.",
            },
        },
    )
    async def ready() -> Response:
        """Readiness to serve requests: every model of the fleet is loaded. Ingest, when
        this process runs it, is reported beside (status 'degraded' while it is not
        running) without failing the probe: a Kafka outage must not take the API of
        every replica out of its load balancer. /ready/ingest is ingest's own probe."""
        model_states = {name: states.state(name) for name in fleet.models}
        ok = all(state == "ready" for state in model_states.values())
        body: dict[str, object] = {"status": "ready" if ok else "not_ready", "models": model_states}
        if ingest_health is not None:
            ingest_status = ingest_health.status()
            body["ingest"] = ingest_status.describe()
            if ok and not ingest_status.up:
                body["status"] = "degraded"
        return JSONResponse(body, status_code=200 if ok else 503)

    if ingest_health is not None:
        kafka_ingest = ingest_health  # narrowed for the handler below

        @app.get(
            "/ready/ingest",
            response_model=None,
            responses={
                200: {"model": IngestReadiness},
                503: {
                    "model": IngestReadiness,
                    "description": "Ingest is starting, restarting after a failure, or stopped.",
                },
            },
        )
        async def ready_ingest() -> Response:
            """Ingest's probe: 200 while it consumes, 503 while it starts, restarts or
            has failed (the body says why)."""
            ingest_status = kafka_ingest.status()
            return JSONResponse(
                ingest_status.describe(), status_code=200 if ingest_status.up else 503
            )

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> Response:
        depth = queue.depth()
        for name in fleet.models:
            metrics.QUEUE_DEPTH.labels(name).set(depth.get(name, 0))
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    docs.install(app)
    return app
