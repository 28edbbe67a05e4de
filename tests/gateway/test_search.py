"""POST /v1/collections/{name}/search: the query is embedded by the collection's model
through the queue, then the store answers with the nearest points and their payloads."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from embedder.tasks.embed.codecs import RequestLimits
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from flotilla.settings import Settings
from flotilla.wiring import gateway_config
from gateway.app import create_app
from ingest.store import Point, point_id
from ingest.store.qdrant import QdrantStore
from tests.fakes import FakeLoader, fake_fleet

TEXTS = {
    "bgb-823": "Schadensersatzpflicht bei unerlaubter Handlung",
    "bgb-195": "Regelmäßige Verjährungsfrist drei Jahre",
    "stgb-242": "Diebstahl einer fremden beweglichen Sache",
    "hgb-1": "Kaufmann ist wer ein Handelsgewerbe betreibt",
}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    fleet = fake_fleet("mini", "other")
    queue = InProcessQueue()
    loader = FakeLoader()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", loader=loader)
    store = QdrantStore(location=":memory:")
    app = create_app(gateway_config(Settings()), fleet, queue, host, store=store)
    async with host:
        await host.wait_ready()
        runtime = loader.runtimes["mini"]
        await store.ensure_collection("laws", 8, "cosine", "mini")
        await store.upsert(
            "laws",
            [
                Point(
                    point_id("laws", doc),
                    runtime.expected_vector(text),
                    {"doc_id": doc, "text": text, "metadata": {"law": doc.split("-")[0]}},
                )
                for doc, text in TEXTS.items()
            ],
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://flotilla") as c:
            yield c
    await store.close()


async def test_the_query_finds_its_own_document_first(client: httpx.AsyncClient) -> None:
    for doc, text in TEXTS.items():
        response = await client.post("/v1/collections/laws/search", json={"query": text})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == "mini"
        assert body["results"][0]["payload"]["doc_id"] == doc
        assert body["results"][0]["score"] == pytest.approx(1.0, abs=1e-5)
        assert len(body["results"]) == len(TEXTS)
        assert float(response.headers["x-inference-time"]) >= 0


async def test_limit_and_filter(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/collections/laws/search",
        json={"query": TEXTS["stgb-242"], "limit": 2, "filter": {"metadata.law": "bgb"}},
    )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert len(results) == 2
    assert {r["payload"]["doc_id"] for r in results} == {"bgb-823", "bgb-195"}


async def test_errors(client: httpx.AsyncClient) -> None:
    missing = await client.post("/v1/collections/nope/search", json={"query": "x"})
    assert missing.status_code == 404
    assert "nope" in missing.json()["error"]["message"]
    for body in ({"limit": 3}, {"query": ""}, {"query": "x", "limit": 0}, {"query": "x", "k": 1}):
        bad = await client.post("/v1/collections/laws/search", json=body)
        assert bad.status_code == 422, (body, bad.text)
    bad_filter = await client.post(
        "/v1/collections/laws/search", json={"query": "x", "filter": {"n": 1.5}}
    )
    assert bad_filter.status_code == 422


async def test_search_goes_the_request_path_of_every_route(client: httpx.AsyncClient) -> None:
    """Counted per route template (not per collection), with the same headers as the
    embedding routes."""
    from tests.gateway.test_api import sample

    route = "/v1/collections/{name}/search"

    async def counts() -> tuple[float, float]:
        text = (await client.get("/metrics")).text
        ok = sample(text, "flotilla_requests_total", model="mini", route=route, status="200")
        missing = sample(
            text, "flotilla_requests_total", model="unknown", route=route, status="404"
        )
        return ok, missing

    ok_before, missing_before = await counts()
    response = await client.post("/v1/collections/laws/search", json={"query": "Diebstahl"})
    assert response.status_code == 200, response.text
    assert len(response.headers["x-request-id"]) == 32
    assert response.headers["x-model"] == "mini"
    assert int(response.headers["x-prompt-tokens"]) == response.json()["usage"]["prompt_tokens"]
    assert float(response.headers["x-total-time"]) >= float(response.headers["x-queue-time"])
    assert (
        await client.post("/v1/collections/nope/search", json={"query": "x"})
    ).status_code == 404
    assert await counts() == (ok_before + 1, missing_before + 1)
