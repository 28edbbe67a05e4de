"""A schema fuzzer driven by the served OpenAPI document: schemathesis generates bodies
(valid and invalid by the document), headers and methods for every route of the real
server (uvicorn, fake models, the embedded store), a bounded number per route, and checks
each answer: never a 5xx, the status and content type documented, the body in the
documented schema (errors included), 405 with Allow for a method a route lacks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import schemathesis

from embedder.core.adapters import AdapterCatalog
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.registry import encoder_loaders
from flotilla.settings import Settings
from flotilla.wiring import gateway_config, record_rules
from gateway.app import create_app
from ingest.embedding import QueueEmbedder
from ingest.pipeline import IngestCore
from ingest.store import Point, point_id
from ingest.store.edge import EdgeStore
from ingest.store.qdrant import QdrantStore
from tests.gateway.conftest import Loader, fake_fleet_with_reranker
from tests.gateway.live import Live, live_server

EXAMPLES_PER_ROUTE = 40
# A small body limit keeps the generated bodies' 413s cheap; inputs up to it are served.
SETTINGS = Settings(max_body_bytes=200_000, max_inputs_per_request=64)

CONFIG = {
    "generation": {
        "max-examples": EXAMPLES_PER_ROUTE,
        "database": "none",  # no example files left behind; each run starts afresh
        "deterministic": True,  # the same cases every run: a failure reproduces
    },
    "phases": {"stateful": {"enabled": False}},
    "checks": {
        "not_a_server_error": {"enabled": True},
        "status_code_conformance": {"enabled": True},
        "content_type_conformance": {"enabled": True},
        "response_schema_conformance": {"enabled": True},
        "negative_data_rejection": {"enabled": True},
        "unsupported_method": {"enabled": True},
        # Valid by the schema is not enough to be served: an unknown model name is a 404.
        "positive_data_acceptance": {"enabled": False},
    },
    "suppress-health-check": ["all"],
}


def document() -> dict[str, Any]:
    """The document the server below serves (the test checks it is the one served): the
    cases are generated at collection, before any server runs."""
    fleet = fake_fleet_with_reranker("alpha", "beta")
    queue = InProcessQueue()
    host = ModelHost(
        fleet, queue, options=[SETTINGS.requests], device="cpu", loaders=encoder_loaders(Loader())
    )
    store = QdrantStore(location=":memory:")
    core = IngestCore(
        QueueEmbedder(queue), store, record_rules(SETTINGS, fleet, AdapterCatalog(fleet))
    )
    app = create_app(gateway_config(SETTINGS), fleet, queue, host, store=store, ingest=core)
    return app.openapi()


DOCUMENT = document()
schema = schemathesis.openapi.from_dict(DOCUMENT, config=schemathesis.Config.from_dict(CONFIG))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    store = EdgeStore(tmp_path_factory.mktemp("fuzz-store"))  # the store `serve` opens

    async def collection(host: ModelHost) -> None:
        """The collection the document's example names, so searches find something."""
        await store.ensure_collection("documents", 8, "cosine", "alpha")
        texts = ["the first document", "a second one", "and a third"]
        vectors = np.random.default_rng(0).standard_normal((len(texts), 8))
        await store.upsert(
            "documents",
            [
                Point(point_id("documents", t), v, {"text": t})
                for t, v in zip(texts, vectors, strict=True)
            ],
        )

    with live_server(SETTINGS, store=store, documents=True, prepare=collection) as server:
        assert httpx.get(f"{server.url}/openapi.json").json() == DOCUMENT
        yield server


@schema.parametrize()
def test_no_route_answers_5xx_or_off_its_document(case: schemathesis.Case, live: Live) -> None:
    case.call_and_validate(base_url=live.url)
