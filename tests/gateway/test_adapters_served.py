"""Adapters through a real `flotilla serve` process, driven by the official OpenAI client:
a mixed stream of base, adapter A (from the fleet file) and adapter B (registered while
the server runs) gets each answer equal to the merged model's; an unknown adapter is a
404 that names the known ones; /v1/models lists the adapters."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import yaml
from numpy.typing import NDArray

from tests.gateway.conftest import _free_port, hub_offline
from tests.ready import wait_ready
from tests.tiny_models import build_tiny_embedder, build_tiny_lora, merged_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow

TEXTS = [
    "Der Vermieter hat die Mietsache instand zu halten.",
    "short",
    "Wer vorsätzlich das Eigentum eines anderen verletzt, ist zum Ersatz verpflichtet.",
    "A sentence in English about the weather in coastal towns.",
]


class Served:
    def __init__(self, url: str, model_dir: Path, fleet_file: Path, adapters: dict[str, Path],
                 registry: Path) -> None:  # fmt: skip
        self.url = url
        self.model_dir = model_dir
        self.fleet_file = fleet_file
        self.adapters = adapters
        self.registry = registry


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("adapters-served")
    with hub_offline():
        model_dir = build_tiny_embedder(folder)
        adapters = {
            name: build_tiny_lora(model_dir, folder / name, seed=seed)
            for name, seed in [("a", 1), ("b", 2)]
        }
    fleet_file = tiny_fleet_file(folder, model_dir)
    raw = yaml.safe_load(fleet_file.read_text())
    raw["models"]["tiny"]["adapters"] = {"a": str(adapters["a"])}
    fleet_file.write_text(yaml.safe_dump(raw))
    port = _free_port()
    registry = folder / "registry"
    command = [sys.executable, "-m", "flotilla", "serve", "--host", "127.0.0.1",
               "--port", str(port), "--fleet", str(fleet_file), "--adapters-dir", str(registry),
               "--device", "cpu", "--data-dir", str(folder / "data")]  # fmt: skip
    log = folder / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, lambda: None if proc.poll() is None else log.read_text())
        yield Served(url, model_dir, fleet_file, adapters, registry)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def lora_add(name: str, folder: Path, served: Served) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flotilla", "lora", "add", name, str(folder), "--base", "tiny",
         "--fleet", str(served.fleet_file), "--adapters-dir", str(served.registry)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def reference(served: Served, adapter: str | None) -> NDArray[np.float32]:
    from sentence_transformers import SentenceTransformer

    with hub_offline():
        if adapter is None:
            model = SentenceTransformer(str(served.model_dir), device="cpu")
        else:
            model = merged_embedder(served.model_dir, served.adapters[adapter])
        return np.asarray(model.encode(TEXTS, normalize_embeddings=True))  # type: ignore[attr-defined]


async def test_a_mixed_stream_gets_the_merged_models_answers(served: Served) -> None:
    # B is registered while the server runs.
    added = lora_add("b", served.adapters["b"], served)
    assert added.returncode == 0, added.stderr
    assert "registered tiny:b" in added.stdout
    want = {name: reference(served, name) for name in (None, "a", "b")}
    async with openai.AsyncOpenAI(
        base_url=f"{served.url}/v1", api_key="unused", max_retries=0
    ) as client:
        asked = [
            (model, i) for i in range(len(TEXTS)) for model in ("tiny", "tiny:a", "tiny:b")
        ] * 4
        replies = await asyncio.gather(
            *(client.embeddings.create(model=model, input=[TEXTS[i]]) for model, i in asked)
        )
        for (model, i), reply in zip(asked, replies, strict=True):
            got = np.asarray(reply.data[0].embedding, dtype=np.float32)
            adapter = model.partition(":")[2] or None
            cosine = float(got @ want[adapter][i])
            assert cosine >= 0.9999, (model, TEXTS[i], cosine)
        # The adapters matter: A's answer is not the base's.
        assert float(want["a"][0] @ want[None][0]) < 0.999

        with pytest.raises(openai.NotFoundError) as caught:
            await client.embeddings.create(model="tiny:nope", input=["x"])
        message = str(caught.value)
        assert "adapter 'nope' is not registered for model 'tiny'" in message
        assert "a, b" in message


def test_the_tei_route_takes_an_adapter_field(served: Served) -> None:
    reply = httpx.post(
        f"{served.url}/embed", json={"inputs": TEXTS[:2], "adapter": "a"}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    got = np.asarray(reply.json(), dtype=np.float32)
    assert float((got * reference(served, "a")[:2]).sum(axis=1).min()) >= 0.9999
    missing = httpx.post(f"{served.url}/embed", json={"inputs": ["x"], "adapter": "zz"}, timeout=30)
    assert missing.status_code == 404
    assert "'zz'" in missing.json()["error"]


def test_lora_add_refuses_an_adapter_trained_on_another_base(
    served: Served, tmp_path: Path
) -> None:
    with hub_offline():
        foreign = build_tiny_lora(served.model_dir, tmp_path / "foreign", seed=5, base="e5")
    refused = lora_add("foreign", foreign, served)
    assert refused.returncode == 2
    assert "trained on 'e5', not on 'tiny'" in refused.stderr
    assert not (served.registry / "tiny" / "foreign").exists()


def test_models_lists_each_adapter_under_its_base(served: Served) -> None:
    models = httpx.get(f"{served.url}/v1/models", timeout=10).json()["data"]
    by_id = {m["id"]: m for m in models}
    assert "tiny" in by_id and "tiny:a" in by_id
    assert by_id["tiny:a"]["parent"] == "tiny" and by_id["tiny:a"]["adapter"] == "a"
