"""What /ready, /ready/ingest and /metrics say about the ingest loop of the process,
through the IngestHealth protocol (the gateway never sees the Kafka source)."""

from __future__ import annotations

import asyncio

import httpx

from embedder.tasks.embed.codecs import RequestLimits
from embedder.host import ModelHost
from flotilla.settings import Settings
from flotilla.wiring import gateway_config
from gateway.app import create_app
from ingest.health import IngestStatus
from tests.gateway.conftest import Loader, RecordingQueue, fake_fleet_with_reranker


class Health:
    def __init__(self) -> None:
        self.now = IngestStatus("starting", "docs")

    def status(self) -> IngestStatus:
        return self.now


async def test_ready_reports_ingest_beside_the_models() -> None:
    fleet = fake_fleet_with_reranker("alpha")
    queue = RecordingQueue()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", loader=Loader())
    health = Health()
    app = create_app(gateway_config(Settings()), fleet, queue, host, ingest_health=health)
    transport = httpx.ASGITransport(app=app)
    async with host, httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        await asyncio.wait_for(host.wait_ready(), 10)
        health.now = IngestStatus("restarting", "docs", 2, "KafkaConnectionError: refused")
        ready = await client.get("/ready")
        # The API serves (200: stay in the load balancer), but does not say all is well.
        assert ready.status_code == 200
        assert ready.json()["status"] == "degraded"
        assert ready.json()["ingest"] == {
            "state": "restarting",
            "topic": "docs",
            "restarts": 2,
            "last_error": "KafkaConnectionError: refused",
        }
        probe = await client.get("/ready/ingest")
        assert probe.status_code == 503
        assert probe.json()["last_error"] == "KafkaConnectionError: refused"

        health.now = IngestStatus("running", "docs", 2)
        ready = await client.get("/ready")
        assert (ready.status_code, ready.json()["status"]) == (200, "ready")
        assert ready.json()["ingest"]["state"] == "running"
        assert (await client.get("/ready/ingest")).status_code == 200


async def test_without_ingest_there_is_no_ingest_probe() -> None:
    fleet = fake_fleet_with_reranker("alpha")
    queue = RecordingQueue()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", loader=Loader())
    app = create_app(gateway_config(Settings()), fleet, queue, host)
    transport = httpx.ASGITransport(app=app)
    async with host, httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        await asyncio.wait_for(host.wait_ready(), 10)
        assert "ingest" not in (await client.get("/ready")).json()
        assert (await client.get("/ready/ingest")).status_code == 404


async def test_the_served_openapi_describes_the_ingest_probe() -> None:
    fleet = fake_fleet_with_reranker("alpha")
    queue = RecordingQueue()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", loader=Loader())
    app = create_app(gateway_config(Settings()), fleet, queue, host, ingest_health=Health())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        spec = (await client.get("/openapi.json")).json()
    probe = spec["paths"]["/ready/ingest"]["get"]["responses"]
    assert set(probe) >= {"200", "503"}
    readiness = spec["components"]["schemas"]["Readiness"]["properties"]
    assert "degraded" in readiness["status"]["enum"] and "ingest" in readiness
