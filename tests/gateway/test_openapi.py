"""The served OpenAPI document describes every route: its request body (the same fields
the worker's decoder reads), its answer and its errors in the route's error shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from embedder.tasks.embed import bodies
from embedder.tasks.embed.codecs import RequestLimits
from embedder.host import ModelHost
from embedder.core.jobs import ApiShape
from embedder.queue.inprocess import InProcessQueue
from flotilla.settings import Settings
from flotilla.wiring import gateway_config
from gateway.app import ROUTES, create_app
from gateway.schemas import DOCUMENTED, SEARCH
from gateway.search import _SearchBody
from ingest.store.qdrant import QdrantStore
from tests.fakes import FakeLoader, fake_fleet
from tests.gateway.conftest import running_stack


@pytest.fixture
async def document() -> AsyncIterator[dict[str, Any]]:
    async with running_stack() as s:
        response = await s.client.get("/openapi.json")
        assert response.status_code == 200
        yield response.json()


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema["$ref"]
    assert ref.startswith("#/components/schemas/")
    resolved: dict[str, Any] = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return resolved


async def test_every_body_route_documents_its_body_answer_and_errors(
    document: dict[str, Any],
) -> None:
    for path, shape in ROUTES.items():
        post = document["paths"][path]["post"]
        body = post["requestBody"]
        assert body["required"] is True
        schema = resolve(document, body["content"]["application/json"]["schema"])
        assert schema["title"] == DOCUMENTED[shape].request.__name__
        assert schema["properties"], path
        responses = post["responses"]
        assert "content" in responses["200"], path
        error = "OpenAIError" if path.startswith(("/v1/", "/v2/")) else "TEIError"
        for status in ("400", "401", "404", "408", "413", "422", "429", "500", "503", "504"):
            ref = responses[status]["content"]["application/json"]["schema"]["$ref"]
            assert ref == f"#/components/schemas/{error}", (path, status)
            assert responses[status]["description"]


def test_the_search_route_is_documented_when_served() -> None:
    fleet = fake_fleet("mini")
    queue = InProcessQueue()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", loader=FakeLoader())
    app = create_app(
        gateway_config(Settings()), fleet, queue, host, store=QdrantStore(location=":memory:")
    )
    document = app.openapi()
    post = document["paths"]["/v1/collections/{name}/search"]["post"]
    schema = resolve(document, post["requestBody"]["content"]["application/json"]["schema"])
    assert schema["additionalProperties"] is False  # as the decoder: unknown fields are 422
    assert set(schema["properties"]) == set(_SearchBody.__struct_fields__)
    assert (
        "SearchResponse"
        in post["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    )
    assert post["responses"]["404"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "OpenAIError"
    )
    assert SEARCH.request.__name__ in document["components"]["schemas"]


async def test_probes_document_their_answers(document: dict[str, Any]) -> None:
    paths = document["paths"]
    assert set(paths["/ready"]["get"]["responses"]) >= {"200", "503"}
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert {"/v1/models", "/health"} <= set(paths)


@pytest.mark.parametrize("shape", list(DOCUMENTED))
def test_documented_fields_are_the_decoded_fields(shape: ApiShape) -> None:
    # The decoders' own structs (embedder.tasks.embed.bodies): the documented request names the same
    # fields, and the routing fields every body may carry, so it cannot drift from them.
    documented = set(DOCUMENTED[shape].request.model_fields)
    decoded = set(bodies.BODIES[shape].__struct_fields__) | {"model", "adapter"}
    assert documented == decoded


def test_every_route_shape_is_documented() -> None:
    assert set(ROUTES.values()) <= set(DOCUMENTED)
