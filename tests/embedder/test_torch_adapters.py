"""LoRA adapters on the real torch runtime (tiny BERT, peft): a batch mixing base and two
adapters gives each row what the merged model gives; eviction and reloading keep it so;
an adapter of another shape is refused and the runtime keeps serving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from embedder.core.adapters import ResidentAdapters
from embedder.core.errors import AdapterInvalid
from embedder.tasks.fleet import load_fleet
from embedder.tasks.embed.runtimes import Runtime, load_runtime
from tests.gateway.conftest import hub_offline
from tests.tiny_models import build_tiny_embedder, build_tiny_lora, merged_embedder, tiny_fleet_file

TEXTS = [
    "Der Vermieter hat die Mietsache instand zu halten.",
    "short",
    "A longer English sentence about shipping schedules and the weather in coastal towns.",
    "Wer vorsätzlich das Eigentum eines anderen verletzt, ist zum Ersatz verpflichtet.",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Path]]:
    folder = tmp_path_factory.mktemp("tiny-lora")
    with hub_offline():
        model_dir = build_tiny_embedder(folder)
        adapters = {
            name: build_tiny_lora(model_dir, folder / name, seed=seed)
            for name, seed in [("a", 1), ("b", 2)]
        }
    return model_dir, tiny_fleet_file(folder, model_dir), adapters


def unit(x: NDArray[np.float32]) -> NDArray[np.float32]:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def reference(model_dir: Path, adapter: Path | None, texts: list[str]) -> NDArray[np.float32]:
    from sentence_transformers import SentenceTransformer

    with hub_offline():
        model = (
            merged_embedder(model_dir, adapter) if adapter else SentenceTransformer(str(model_dir))
        )
        return np.asarray(model.encode(texts, normalize_embeddings=True))  # type: ignore[attr-defined]


def encode(runtime: Runtime, texts: list[str], adapters: list[str | None]) -> NDArray[np.float32]:
    return unit(runtime.forward(runtime.tokenize(texts, "right"), adapters))


def test_a_mixed_batch_matches_the_merged_models(tiny: tuple[Path, Path, dict[str, Path]]) -> None:
    model_dir, fleet_file, adapters = tiny
    runtime = load_runtime(load_fleet(fleet_file).get("tiny"), "cpu", 1)
    base_before = encode(runtime, TEXTS, [None] * len(TEXTS))
    for name, folder in adapters.items():
        runtime.load_adapter(name, folder)
    # Every text under every choice, interleaved in one call.
    choices: list[str | None] = [None, "a", "b"]
    texts = [t for t in TEXTS for _ in choices]
    rows = [c for _ in TEXTS for c in choices]
    got = encode(runtime, texts, rows)
    want = {
        None: reference(model_dir, None, TEXTS),
        "a": reference(model_dir, adapters["a"], TEXTS),
        "b": reference(model_dir, adapters["b"], TEXTS),
    }
    for i, (text_index, choice) in enumerate((t, c) for t in range(len(TEXTS)) for c in choices):
        cosine = float(got[i] @ want[choice][text_index])
        assert cosine >= 0.9999, (choice, TEXTS[text_index], cosine)
    # The adapters really change the vectors, and base rows are untouched by them.
    assert float((want["a"] * want[None]).sum(axis=1).min()) < 0.999
    np.testing.assert_allclose(encode(runtime, TEXTS, [None] * len(TEXTS)), base_before, atol=1e-5)
    # With adapters resident, a pass that names none still runs the base model.
    np.testing.assert_allclose(
        unit(runtime.forward(runtime.tokenize(TEXTS, "right"))), base_before, atol=1e-5
    )


def test_eviction_and_reload_keep_answers_right(tiny: tuple[Path, Path, dict[str, Path]]) -> None:
    model_dir, fleet_file, adapters = tiny
    runtime = load_runtime(load_fleet(fleet_file).get("tiny"), "cpu", 1)
    resident = ResidentAdapters(1, runtime.load_adapter, runtime.unload_adapter)
    want_a = reference(model_dir, adapters["a"], TEXTS)
    for name in ["a", "b", "a"]:  # cap 1: each switch unloads the other
        assert resident.ensure({name: adapters[name]}) == {}
        assert resident.names == [name]
        got = encode(runtime, TEXTS, [name] * len(TEXTS))
        want = want_a if name == "a" else reference(model_dir, adapters["b"], TEXTS)
        assert float((got * want).sum(axis=1).min()) >= 0.9999


def test_an_adapter_of_another_shape_is_refused_and_serving_goes_on(
    tiny: tuple[Path, Path, dict[str, Path]], tmp_path: Path
) -> None:
    model_dir, fleet_file, adapters = tiny
    with hub_offline():
        wide = build_tiny_embedder(tmp_path / "wide", hidden=48)
        foreign = build_tiny_lora(wide, tmp_path / "foreign", seed=3)
    runtime = load_runtime(load_fleet(fleet_file).get("tiny"), "cpu", 1)
    runtime.load_adapter("a", adapters["a"])
    with pytest.raises(AdapterInvalid, match="does not fit model 'tiny'"):
        runtime.load_adapter("foreign", foreign)
    got = encode(runtime, TEXTS, ["a"] * len(TEXTS))
    assert float((got * reference(model_dir, adapters["a"], TEXTS)).sum(axis=1).min()) >= 0.9999
