"""The task-kind seam: the registry drives the fleet file, the host and the gateway's
routes, so a new kind is one folder plus one registry line (the echo kind here)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from embedder.core.fleet import FleetError
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.fleet import load_fleet, parse_fleet
from embedder.tasks.registry import TASKS
from flotilla.settings import Settings
from flotilla.wiring import gateway_config
from gateway.app import create_app
from tests.embedder.tasks.echo_kind import echo


def test_every_built_in_kind_is_registered_with_its_routes() -> None:
    assert set(TASKS) == {"embed", "rerank", "generate", "ocr"}
    paths = [path for kind in TASKS.values() for path in kind.routes]
    assert len(paths) == len(set(paths))  # no route answered by two kinds
    assert "/v1/embeddings" in TASKS["embed"].routes
    assert TASKS["rerank"].answering == ("rerank", "embed")


def test_a_field_of_another_kind_is_a_load_error_naming_it(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "models:\n  mini:\n    source: {path: .}\n    task: embed\n"
        "    profiles: {cpu: {ocr_detect_pixels: 100}}\n"
    )
    with pytest.raises(FleetError, match="ocr_detect_pixels"):
        load_fleet(fleet)
    fleet.write_text("models:\n  mini:\n    source: {path: .}\n    task: translate\n")
    with pytest.raises(FleetError, match="'translate' is not a task kind; known: embed"):
        load_fleet(fleet)


@contextlib.asynccontextmanager
async def serving_parrot() -> AsyncIterator[tuple[ModelHost, httpx.AsyncClient]]:
    """The echo kind's model 'parrot' served by a real host and gateway, once loaded."""
    fleet = parse_fleet({"models": {"parrot": {"source": {"path": "."}, "task": "echo"}}})
    queue = InProcessQueue()
    host = ModelHost(fleet, queue, device="cpu")
    app = create_app(gateway_config(Settings()), fleet, queue, host)
    transport = httpx.ASGITransport(app=app)
    async with host, httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        async with asyncio.timeout(30):
            await host.wait_ready()
        yield host, client


async def test_a_new_kind_is_one_folder_and_one_registry_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(TASKS, "echo", echo.KIND)  # the registry line
    async with serving_parrot() as (_, client):
        answer = await client.post("/v1/echo", json={"model": "parrot", "text": "ahoy"})
        models = (await client.get("/v1/models")).json()["data"]
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"echo": "AHOY", "model": "parrot"}
    assert [(m["id"], m["task"], m["state"]) for m in models] == [("parrot", "echo", "ready")]


async def test_a_model_whose_loop_died_reads_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind's loop that ends (here cancelled; a bug would end it the same way, logged by
    its watch) leaves its model failed in /ready, rather than taking requests nobody runs."""
    monkeypatch.setitem(TASKS, "echo", echo.KIND)
    async with serving_parrot() as (host, client):
        assert (await client.get("/ready")).status_code == 200
        loop = host.engines["echo"].loops["parrot"]  # type: ignore[attr-defined]
        loop._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop._task
        ready = await client.get("/ready")
        models = (await client.get("/v1/models")).json()["data"]
    assert ready.status_code == 503 and ready.json()["models"] == {"parrot": "failed"}
    assert models[0]["state"] == "failed" and "engine stopped" in models[0]["error"]
