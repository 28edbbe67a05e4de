"""The worker's small HTTP port, spoken to by a real HTTP client."""

from __future__ import annotations

import httpx

import embedder.metrics  # noqa: F401  (registers the worker's counters, as a worker does)
from flotilla.worker_http import WorkerHttp


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
