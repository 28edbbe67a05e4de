"""Loading on demand through `flotilla serve` itself (build_app under uvicorn, tiny
random-weight models): the first request loads its model and is answered with its
vectors, /ready counts an evicted model as ready, /v1/models and /metrics show the
residency, and a model whose measured load is longer than a request's deadline answers
503 with Retry-After at once."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from embedder.host import ModelHost
from flotilla.serve import build_app
from flotilla.settings import Settings
from tests.gateway.conftest import _free_port, hub_offline
from tests.ready import served_in_thread
from tests.tiny_models import build_tiny_embedder

pytestmark = pytest.mark.slow
PROFILE = {"cpu": {"dtype": "float32", "max_batch_tokens": 4096, "max_wait_ms": 2}}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    with hub_offline():
        folder = tmp_path_factory.mktemp("on-demand")
        return build_tiny_embedder(folder / "a", seed=1), build_tiny_embedder(folder / "b", seed=2)


@pytest.fixture
def served(models: tuple[Path, Path], tmp_path: Path) -> Iterator[tuple[str, ModelHost]]:
    fleet = tmp_path / "fleet.yaml"  # names of their own: the metrics are per process
    entries = {
        name: {"source": {"path": str(folder)}, "max_tokens": 64, "profiles": PROFILE,
               "load": "on_demand"}
        for name, folder in zip(("od-first", "od-second"), models, strict=True)
    }  # fmt: skip
    fleet.write_text(yaml.safe_dump({"models": entries}), encoding="utf-8")
    settings = Settings(
        fleet=fleet, data_dir=tmp_path / "data", model_cache_dir=tmp_path / "cache",
        device="cpu", untuned="defaults", memory_budget_mb=10_000,
    )  # fmt: skip
    app = build_app(settings)
    with hub_offline(), served_in_thread(app, _free_port(), "on-demand-server") as url:
        yield url, app.state.host


def alone(folder: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(texts, normalize_embeddings=True)


async def test_the_first_request_loads_its_model(
    served: tuple[str, ModelHost], models: tuple[Path, Path]
) -> None:
    url, host = served
    texts = ["a first request", "and another one"]
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        ready = await client.get("/ready")
        assert ready.status_code == 200 and ready.json()["models"]["od-first"] == "evicted"
        answer = await client.post("/v1/embeddings", json={"model": "od-first", "input": texts})
        assert answer.status_code == 200, answer.text
        got = np.array([row["embedding"] for row in answer.json()["data"]])
        assert np.abs(got - alone(models[0], texts)).max() < 1e-5
        listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        assert listed["od-first"]["state"] == "ready" and listed["od-first"]["loads"] == 1
        assert listed["od-first"]["memory_bytes"] > 0 and listed["od-first"]["load"] == "on_demand"
        assert listed["od-second"]["state"] == "evicted" and listed["od-second"]["loads"] == 0
        metrics = (await client.get("/metrics")).text
        assert re.search(
            r'flotilla_model_loads_total\{model="od-first",outcome="loaded"\} 1\.0', metrics
        )

        host.residents.records["od-second"].load_s = 30.0  # as if it had taken 30 s before
        late = await client.post(
            "/v1/embeddings", json={"model": "od-second", "input": ["hurry"]},
            headers={"x-request-timeout-ms": "2000"},
        )  # fmt: skip
        assert late.status_code == 503 and late.headers["retry-after"] == "30", late.text
        assert "it took 30.0 s last time" in late.json()["error"]["message"]
