"""The admin API of `flotilla serve` itself (flotilla.serve.build_app under uvicorn, a tiny
random-weight model): a model added is served, one removed under load answers the
requests it took and then no more, only the admin key opens the admin routes, and
--fleet-state records the changes."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flotilla.fleet_state import read_state
from flotilla.serve import build_app
from flotilla.settings import Settings
from tests.gateway.conftest import _free_port, hub_offline
from tests.ready import served_in_thread
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow

CLIENT_KEY, ADMIN_KEY = "client-key", "admin-key"
CLIENT = {"authorization": f"Bearer {CLIENT_KEY}"}
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
PROFILE = {"cpu": {"dtype": "float32", "max_batch_tokens": 4096, "max_wait_ms": 2}}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with hub_offline():
        return build_tiny_embedder(tmp_path_factory.mktemp("admin-model"))


@pytest.fixture
def served(model: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`flotilla serve` with the tiny model as 'tiny', admin keys and a fleet-state file."""
    state = tmp_path / "fleet-state.yaml"
    settings = Settings(
        fleet=tiny_fleet_file(tmp_path, model),
        data_dir=tmp_path / "data",
        model_cache_dir=tmp_path / "cache",
        device="cpu",
        api_keys=CLIENT_KEY,
        admin_keys=ADMIN_KEY,
        fleet_state=state,
    )
    with (
        hub_offline(),
        served_in_thread(build_app(settings), _free_port(), "admin-test-server") as url,
    ):
        yield url, state


def inflight_tokens(metrics: str, model: str) -> float:
    found = re.search(rf'^flotilla_inflight_tokens\{{model="{model}"\}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


async def embed(client: httpx.AsyncClient, model: str, texts: int = 1) -> httpx.Response:
    body = {"model": model, "input": [f"text number {i} about rent law" for i in range(texts)]}
    return await client.post("/v1/embeddings", json=body, headers=CLIENT)


async def until_served(client: httpx.AsyncClient, model: str) -> None:
    """A 'load: start' model added loads in the background; 503 until it is resident."""
    deadline = time.monotonic() + 120
    while (response := await embed(client, model)).status_code == 503:
        assert time.monotonic() < deadline, response.text
        await asyncio.sleep(0.2)
    assert response.status_code == 200, response.text


async def test_add_use_and_remove_under_load(served: tuple[str, Path], model: Path) -> None:
    url, state = served
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        entry = {"name": "tiny-two", "source": {"path": str(model)}, "max_tokens": 64}
        for refused in ({}, CLIENT):  # the admin key only
            response = await client.post("/admin/models", json=entry, headers=refused)
            assert response.status_code == 401, response.text
        assert (await embed(client, "tiny-two")).status_code == 404
        added = await client.post(
            "/admin/models", json={**entry, "profiles": PROFILE}, headers=ADMIN
        )
        assert added.status_code == 201, added.text
        assert added.json()["kept"] == f"kept in {state}"
        assert "tiny-two" in read_state(state).added
        await until_served(client, "tiny-two")
        listed = (await client.get("/admin/models", headers=ADMIN)).json()
        assert [m["name"] for m in listed["data"]] == ["tiny", "tiny-two"]

        load = [asyncio.create_task(embed(client, "tiny-two", texts=64)) for _ in range(16)]
        while not inflight_tokens((await client.get("/metrics")).text, "tiny-two"):
            assert not all(task.done() for task in load), "the load ended before it was seen"
            await asyncio.sleep(0.005)
        removed = await client.delete("/admin/models/tiny-two", headers=ADMIN)
        assert removed.status_code == 200, removed.text
        answers = await asyncio.gather(*load)
        # Each request taken before the removal finished; any sent after it got 404.
        assert 200 in {r.status_code for r in answers} <= {200, 404}
        assert (await embed(client, "tiny-two")).status_code == 404
        assert not inflight_tokens((await client.get("/metrics")).text, "tiny-two")
        assert (await embed(client, "tiny")).status_code == 200  # the rest serves on
        assert read_state(state).added == {}
        response = await client.delete("/admin/models/tiny", headers=CLIENT)
        assert response.status_code == 401
