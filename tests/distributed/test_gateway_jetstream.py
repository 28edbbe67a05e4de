"""`flotilla gateway` and `flotilla worker` wired as their commands wire them, in one process
over the real nats-server (fake models): the same answers and statuses as the in-process
stack, 503 while no worker serves a model, and 504, never a hang, when no worker answers."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml

from bench.services.nats import NatsServer
from embedder.core.jobs import ModelState
from embedder.queue.jetstream.liveness import WorkerLiveness
from embedder.tasks.fleet import load_fleet
from flotilla.distributed import build_gateway_app, run_worker
from flotilla.settings import Settings
from tests.distributed.helpers import bounded, eventually
from tests.fakes import FAIL_MARKER, FakeLoader
from tests.gateway.conftest import running_stack
from tests.kafka.fixtures import unique_name

pytestmark = pytest.mark.slow  # starts the server

WAIT_S = 20.0


@pytest.fixture
def settings(nats_server: NatsServer, tmp_path: Path) -> Settings:
    fleet = tmp_path / "fleet.yaml"
    profile = {"cpu": {"max_batch_tokens": 512, "max_batch_requests": 16, "max_wait_ms": 1}}
    models = {
        name: {"source": {"path": str(tmp_path)}, "max_tokens": 64, "profiles": profile}
        for name in ("alpha", "beta")
    }
    fleet.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
    stream = unique_name("JOBS").replace("-", "_")
    return Settings(
        nats=nats_server.url,
        fleet=fleet,
        device="cpu",
        max_inputs_per_request=4,
        nats_stream=stream,
        nats_subject_prefix=f"jobs.{stream}",
        nats_storage="memory",
        nats_max_bytes=32 * 1024 * 1024,  # memory streams reserve it on the shared server
        reply_topic_prefix=unique_name("replies"),
        gateway_id="test",
        worker_port=0,
    )


@contextlib.asynccontextmanager
async def gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = build_gateway_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client,
    ):
        yield client


@contextlib.asynccontextmanager
async def worker(settings: Settings) -> AsyncIterator[None]:
    stop = asyncio.Event()
    running = asyncio.create_task(run_worker(settings, stop, loader=FakeLoader()))
    try:
        yield
    finally:
        stop.set()
        async with asyncio.timeout(WAIT_S):
            await running  # drains, hands back what is left and says goodbye


async def ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/ready")).status_code == 200


async def until_ready(client: httpx.AsyncClient) -> None:
    await eventually(lambda: ready(client), "the gateway to see a worker serving")


REQUESTS: list[tuple[str, object]] = [
    ("/v1/embeddings", {"model": "alpha", "input": ["the quick brown fox", "hello"]}),
    ("/v1/embeddings", {"model": "beta", "input": "one text", "encoding_format": "base64"}),
    ("/embed", {"inputs": ["jumps over the lazy dog"], "normalize": False}),
    ("/", {"inputs": "root route"}),
    ("/embed", {"inputs": ["a", "b", "c", "d", "e"]}),  # over max_inputs_per_request: 413
    ("/v1/embeddings", {"model": "alpha", "input": [f"x {FAIL_MARKER}"]}),  # the model raises
    ("/embed", {"inputs": 5}),  # decoded by the worker, refused there: 422
    ("/v1/embeddings", {"model": "nope", "input": "x"}),  # refused by the gateway: 404
]


async def test_answers_and_statuses_match_the_in_process_stack(settings: Settings) -> None:
    async with gateway(settings) as client, worker(settings):
        await until_ready(client)
        over_nats = [await client.post(path, json=body) for path, body in REQUESTS]
        models = (await client.get("/v1/models")).json()["data"]
    async with running_stack(settings, load_fleet(settings.fleet), FakeLoader()) as stack:
        in_process = [await stack.client.post(path, json=body) for path, body in REQUESTS]
    for (path, _), got, want in zip(REQUESTS, over_nats, in_process, strict=True):
        assert (path, got.status_code) == (path, want.status_code), got.text
        assert got.json() == want.json()
        assert got.headers["content-type"] == want.headers["content-type"]
        if got.status_code == 200:
            assert got.headers["x-prompt-tokens"] == want.headers["x-prompt-tokens"]
    assert {m["id"]: (m["state"], m["workers"]) for m in models} == {
        "alpha": ("ready", 1),
        "beta": ("ready", 1),
    }


async def test_no_live_worker_means_503_at_once(settings: Settings) -> None:
    async with gateway(settings) as client:
        ready = await client.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["models"] == {"alpha": "loading", "beta": "loading"}
        started = time.monotonic()
        response = await client.post("/embed", json={"inputs": "hello"})
        assert response.status_code == 503
        assert response.headers["retry-after"]
        assert time.monotonic() - started < 2


class _ClaimsReady:
    """A worker's states that say every model is ready, for a worker that never pulls."""

    def state(self, model: str) -> ModelState:
        return "ready"

    def describe(self, model: str) -> dict[str, object]:
        return {}


@bounded(120)
async def test_a_request_no_worker_answers_ends_in_504_not_a_hang(settings: Settings) -> None:
    assert settings.nats is not None
    beat = WorkerLiveness(
        url=settings.nats,
        worker_id="silent",
        models=["alpha", "beta"],
        states=_ClaimsReady(),
        config=settings.jetstream,
    )
    async with gateway(settings) as client, beat:
        await until_ready(client)
        started = time.monotonic()
        response = await client.post(
            "/embed", json={"inputs": "hello"}, headers={"x-request-timeout-ms": "500"}
        )
        took = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert response.json()["error_type"] == "deadline_exceeded"
    assert 0.4 < took < 3.0


async def test_a_worker_leaving_is_seen_at_once(settings: Settings) -> None:
    async with gateway(settings) as client:
        async with worker(settings):
            await until_ready(client)

        # The worker deleted its liveness key on its way out: no waiting for it to expire.
        async def not_ready() -> bool:
            return not await ready(client)

        await eventually(not_ready, "the gateway to see the worker gone", timeout_s=5)


async def test_a_worker_with_two_models_answers_both_without_stalls(settings: Settings) -> None:
    """Mixed traffic to the two models one worker hosts: each request is answered in a
    fraction of a second; one stranded behind the other model's fetch would take the
    ack wait (10 s) to come back."""
    rng = random.Random(5)
    latencies: list[float] = []
    async with gateway(settings) as client, worker(settings):
        await until_ready(client)

        async def one(i: int) -> None:
            model = "alpha" if rng.random() < 0.7 else "beta"
            await asyncio.sleep(rng.random() * 2.0)
            started = time.monotonic()
            response = await client.post("/v1/embeddings", json={"model": model, "input": f"t{i}"})
            latencies.append(time.monotonic() - started)
            assert response.status_code == 200, response.text
            assert response.json()["model"] == model

        await asyncio.gather(*(one(i) for i in range(150)))
    assert len(latencies) == 150
    assert max(latencies) < 1.0, sorted(latencies)[-5:]
