"""The documents routes of the server that owns the store: a batch upserted through the
same IngestCore as Kafka ingest (bad documents answered one by one, the good ones
stored), sent again without a change, deleted by id, and found by the search route."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from embedder.core.adapters import AdapterCatalog
from embedder.tasks.embed.codecs import RequestLimits
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from flotilla.settings import Settings
from flotilla.wiring import gateway_config, record_rules
from gateway.app import create_app
from ingest.embedding import QueueEmbedder
from ingest.pipeline import IngestCore
from ingest.store import CollectionNotFound, point_id
from ingest.store.edge import EdgeStore
from tests.fakes import FakeLoader, FakeRuntime, fake_fleet
from tests.gateway.test_api import sample

ROUTE = "/v1/collections/laws/documents"
DOCS = [
    {
        "id": "bgb-823",
        "text": "Schadensersatz bei unerlaubter Handlung",
        "metadata": {"law": "bgb"},
    },
    {"id": "stgb-242", "text": "Diebstahl einer fremden beweglichen Sache"},
    {"id": "hgb-1", "text": "Kaufmann ist wer ein Handelsgewerbe betreibt", "metadata": {"n": 1}},
]


@dataclass
class Server:
    client: httpx.AsyncClient
    store: EdgeStore
    runtime: FakeRuntime


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    """As `flotilla serve` wires it (wiring's rules and limits), with fakes for the models
    and the real embedded store."""
    settings = Settings(ingest_max_records=8, max_inflight_tokens=4000)
    fleet = fake_fleet("mini", "other")
    queue = InProcessQueue()
    loader = FakeLoader()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", loader=loader)
    store = EdgeStore(tmp_path / "data")
    core = IngestCore(
        QueueEmbedder(queue), store, record_rules(settings, fleet, AdapterCatalog(fleet))
    )
    app = create_app(gateway_config(settings), fleet, queue, host, store=store, ingest=core)
    async with host, store:
        await host.wait_ready()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://flotilla") as client:
            yield Server(client, store, loader.runtimes["mini"])


async def stored(server: Server, ids: list[str]) -> dict[str, dict[str, Any]]:
    points = await server.store.retrieve("laws", [point_id("laws", i) for i in ids])
    return {p.payload["doc_id"]: p.payload for p in points}


async def test_a_batch_is_stored_and_a_bad_document_answered_alone(server: Server) -> None:
    batch = [DOCS[0], {"text": "no id here"}, DOCS[1], {"id": "blank", "text": "   "}, DOCS[2]]
    response = await server.client.post(ROUTE, json={"documents": batch})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["collection"], body["model"]) == ("laws", "mini")
    assert (body["upserted"], body["failed"]) == (3, 2)
    outcomes = [(r["index"], r["id"], r["status"]) for r in body["results"]]
    assert outcomes == [
        (0, "bgb-823", "upserted"),
        (1, None, "failed"),
        (2, "stgb-242", "upserted"),
        (3, "blank", "failed"),
        (4, "hgb-1", "upserted"),
    ]
    assert "no document id" in body["results"][1]["error"]["message"]
    assert "empty" in body["results"][3]["error"]["message"]
    assert await server.store.count("laws") == 3
    payloads = await stored(server, ["bgb-823", "hgb-1"])
    assert payloads["bgb-823"]["metadata"] == {"law": "bgb"}
    assert payloads["hgb-1"]["text"] == DOCS[2]["text"]

    # What the route stored, the search route finds: each text finds its own document.
    for doc in DOCS:
        found = await server.client.post(
            "/v1/collections/laws/search", json={"query": doc["text"], "limit": 1}
        )
        assert found.status_code == 200, found.text
        (hit,) = found.json()["results"]
        assert hit["payload"]["doc_id"] == doc["id"]
        assert hit["score"] == pytest.approx(1.0, abs=1e-5)


async def test_sending_a_batch_again_gives_the_same_points(server: Server) -> None:
    first = await server.client.post(ROUTE, json={"documents": DOCS})
    assert first.json()["upserted"] == 3
    before = await server.store.retrieve("laws", [point_id("laws", d["id"]) for d in DOCS])
    again = await server.client.post(ROUTE, json={"documents": DOCS})
    assert again.status_code == 200 and again.json() == first.json()
    after = await server.store.retrieve("laws", [point_id("laws", d["id"]) for d in DOCS])
    assert await server.store.count("laws") == 3
    assert [(p.id, p.payload, list(p.vector)) for p in after] == [
        (p.id, p.payload, list(p.vector)) for p in before
    ]
    # A changed text replaces its document's point, not adds one.
    changed = {**DOCS[1], "text": "Raub mit Gewalt gegen eine Person"}
    assert (await server.client.post(ROUTE, json={"documents": [changed]})).status_code == 200
    assert await server.store.count("laws") == 3
    assert (await stored(server, ["stgb-242"]))["stgb-242"]["text"] == changed["text"]


async def test_delete_by_id_one_or_a_batch(server: Server) -> None:
    await server.client.post(ROUTE, json={"documents": DOCS})
    one = await server.client.delete(f"{ROUTE}/bgb-823")
    assert one.status_code == 200, one.text
    assert one.json() == {
        "collection": "laws",
        "deleted": 1,
        "failed": 0,
        "results": [{"index": 0, "id": "bgb-823", "status": "deleted"}],
    }
    assert set(await stored(server, [d["id"] for d in DOCS])) == {"stgb-242", "hgb-1"}
    # Batched; an id never written is deleted as well (idempotent), an empty one refused.
    many = await server.client.post(f"{ROUTE}/delete", json={"ids": ["hgb-1", "never", ""]})
    assert many.status_code == 200, many.text
    assert [r["status"] for r in many.json()["results"]] == ["deleted", "deleted", "failed"]
    assert await server.store.count("laws") == 1
    found = await server.client.post("/v1/collections/laws/search", json={"query": "Kaufmann"})
    assert [h["payload"]["doc_id"] for h in found.json()["results"]] == ["stgb-242"]


async def test_one_model_embeds_a_request(server: Server) -> None:
    """The request's model, else the collection's: a collection keeps its first model."""
    response = await server.client.post(
        "/v1/collections/other-docs/documents", json={"documents": DOCS[:1], "model": "other"}
    )
    assert response.json()["model"] == "other"
    more = await server.client.post(
        "/v1/collections/other-docs/documents", json={"documents": DOCS[1:]}
    )
    assert more.json()["model"] == "other"
    refused = await server.client.post(
        ROUTE.replace("laws", "other-docs"), json={"documents": DOCS, "model": "mini"}
    )
    assert refused.status_code == 409, refused.text
    assert "holds vectors of 'other'" in refused.json()["error"]["message"]


async def test_a_collection_of_a_model_not_served_is_refused(server: Server) -> None:
    await server.store.ensure_collection("old", 8, "cosine", "gone")
    response = await server.client.post("/v1/collections/old/documents", json={"documents": DOCS})
    assert response.status_code == 404, response.text
    assert "holds vectors of 'gone', which this server does not serve" in response.text
    assert await server.store.count("old") == 0


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        (ROUTE, {"documents": []}, 422, "'documents' is empty"),
        (ROUTE, {"docs": DOCS}, 422, 'send {"documents"'),
        (ROUTE, {"documents": DOCS, "model": "nope"}, 404, "model 'nope' is not served"),
        (ROUTE, {"documents": DOCS * 3}, 413, "--ingest-max-records"),
        (ROUTE, {"documents": [{"id": "x", "text": "word " * 5000}]}, 413, "--max-inflight-tokens"),
        ("/v1/collections/bad name/documents", {"documents": DOCS}, 422, "collection name"),
        ("/v1/collections/nope/documents/delete", {"ids": ["a"]}, 404, "'nope' not found"),
        (f"{ROUTE}/delete", {"ids": "a"}, 422, 'send {"ids"'),
    ],
)
async def test_a_request_refused_as_a_whole(
    server: Server, path: str, body: dict[str, Any], status: int, says: str
) -> None:
    response = await server.client.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]  # the /v1 error shape
    assert says in error["message"] and error["code"] == status
    assert await count(server, "laws") == 0


async def count(server: Server, collection: str) -> int:
    try:
        return await server.store.count(collection)
    except CollectionNotFound:
        return 0


async def test_a_body_nested_too_deep_is_refused_not_a_crash(server: Server) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    body = '{"documents": [{"id": "a", "text": "t", "metadata": {"m": ' + deep + "}}]}"
    response = await server.client.post(
        ROUTE, content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert "levels deep" in response.json()["error"]["message"]


async def test_counted_per_route_template(server: Server) -> None:
    await server.client.post(ROUTE, json={"documents": DOCS})
    await server.client.post(ROUTE, json={"documents": []})
    metrics = (await server.client.get("/metrics")).text
    route = "/v1/collections/{name}/documents"
    assert sample(metrics, "flotilla_requests_total", model="mini", route=route, status="200") >= 1
    assert (
        sample(metrics, "flotilla_requests_total", model="unknown", route=route, status="422") >= 1
    )
