"""The worker's small HTTP port, spoken to by a real HTTP client."""

from __future__ import annotations

import httpx

import embedder.serving.metrics  # noqa: F401  (registers the worker's counters, as a worker does)
from flotilla.worker_http import WorkerHttp
from ingest.health import IngestStatus


async def test_health_ready_metrics_and_the_rest() -> None:
    ready = False
    async with (
        WorkerHttp("127.0.0.1", 0, lambda: ready) as http,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{http.bound_port}") as client,
    ):
        assert (await client.get("/health")).json() == {"status": "ok"}
        assert (await client.get("/ready")).status_code == 503
        ready = True
        assert (await client.get("/ready?verbose=1")).status_code == 200
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert "flotilla_jobs" in metrics.text  # the worker's counters are registered
        assert metrics.headers["content-type"].startswith("text/plain")
        assert (await client.get("/nope")).status_code == 404
        assert (await client.post("/ready")).status_code == 405
        head = await client.head("/health")
        assert head.status_code == 200 and head.content == b""


class Ingest:
    def __init__(self) -> None:
        self.now = IngestStatus("restarting", "docs", restarts=2, last_error="broker gone")

    def status(self) -> IngestStatus:
        return self.now


async def test_a_worker_that_ingests_reports_it_as_serve_does() -> None:
    ingest = Ingest()
    ready = True
    async with (
        WorkerHttp("127.0.0.1", 0, lambda: ready, ingest=ingest) as http,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{http.bound_port}") as client,
    ):
        # Ingest down: the probe still passes (online requests are served), and says why.
        answer = await client.get("/ready")
        assert answer.status_code == 200
        assert answer.json() == {
            "status": "degraded",
            "ingest": {
                "state": "restarting",
                "topic": "docs",
                "restarts": 2,
                "last_error": "broker gone",
            },
        }
        assert (await client.get("/ready/ingest")).status_code == 503
        ingest.now = IngestStatus("running", "docs", restarts=2)
        assert (await client.get("/ready")).json()["status"] == "ready"
        running = await client.get("/ready/ingest")
        assert running.status_code == 200 and running.json()["state"] == "running"
        ready = False
        assert (await client.get("/ready")).status_code == 503
        assert "/ready/ingest" in (await client.get("/nope")).json()["error"]


async def test_without_ingest_there_is_no_ingest_probe() -> None:
    async with (
        WorkerHttp("127.0.0.1", 0, lambda: True) as http,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{http.bound_port}") as client,
    ):
        assert (await client.get("/ready")).json() == {"status": "ready"}
        assert (await client.get("/ready/ingest")).status_code == 404
