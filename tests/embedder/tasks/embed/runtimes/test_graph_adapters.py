"""LoRA adapters on ONNX Runtime and OpenVINO (tiny BERT, tiny random LoRAs): each adapter
a graph of its own with the adapter merged, built in the background; a mixed batch gives
each row what the merged torch model gives, base rows stay the base model's, a second
start reuses the built graph, and an adapter that does not fit is refused clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

import embedder.tasks.embed.runtimes.export as export
from embedder.core.adapters import ResidentAdapters
from embedder.core.errors import AdapterBuilding, AdapterInvalid
from embedder.tasks.embed.runtimes import Runtime, load_runtime
from tests.embedder.tasks.embed.runtimes.conftest import TEXTS, spec_for, worst_cosine
from tests.tiny_models import build_tiny_embedder, build_tiny_lora, merged_embedder

GRAPH_RUNTIMES = ["onnx", "openvino"]
BUILD_S = 120.0  # a tiny model's merged export takes seconds; a hang fails instead


@pytest.fixture(scope="module")
def tiny_adapters(tiny_embedder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tiny-graph-lora")
    return {
        name: build_tiny_lora(tiny_embedder, folder / name, seed=seed)
        for name, seed in [("a", 1), ("b", 2)]
    }


def load(folder: Path, runtime: str) -> Runtime:
    return load_runtime(spec_for(folder, runtime), "cpu", 1)


def loaded(runtime: Runtime, name: str, folder: Path) -> None:
    """Load the adapter as the worker does: AdapterBuilding until its graph is ready."""
    try:
        runtime.load_adapter(name, folder)
    except AdapterBuilding as building:
        assert building.ready is not None and "is being built" in building.message
        building.ready.result(timeout=BUILD_S)
        runtime.load_adapter(name, folder)


def merged_reference(model_dir: Path, adapter: Path | None) -> NDArray[np.float32]:
    from sentence_transformers import SentenceTransformer

    model = merged_embedder(model_dir, adapter) if adapter else SentenceTransformer(str(model_dir))
    return np.asarray(model.encode(TEXTS))  # type: ignore[attr-defined]


@pytest.mark.parametrize("runtime", GRAPH_RUNTIMES)
def test_a_mixed_batch_matches_the_merged_torch_models(
    tiny_embedder: Path, tiny_adapters: dict[str, Path], runtime: str
) -> None:
    graph = load(tiny_embedder, runtime)
    encoded = graph.tokenize(TEXTS, "right")
    base_before = graph.forward(encoded)
    for name, folder in tiny_adapters.items():
        loaded(graph, name, folder)
    choices: list[str | None] = [[None, "a", "b"][i % 3] for i in range(len(TEXTS))]
    got = graph.forward(encoded, choices)
    want = {None: merged_reference(tiny_embedder, None)} | {
        name: merged_reference(tiny_embedder, folder) for name, folder in tiny_adapters.items()
    }
    for choice in (None, "a", "b"):
        rows = [i for i, c in enumerate(choices) if c == choice]
        assert worst_cosine(got[rows], want[choice][rows]) >= 0.9999, choice
    assert worst_cosine(want["a"], want[None]) < 0.999  # the adapters change the vectors
    # Base rows are the base model's, with adapters resident or without a name.
    np.testing.assert_allclose(graph.forward(encoded, [None] * len(TEXTS)), base_before, atol=1e-5)
    np.testing.assert_allclose(graph.forward(encoded), base_before, atol=1e-5)


@pytest.mark.parametrize("runtime", GRAPH_RUNTIMES)
def test_a_second_start_reuses_the_built_graph(
    tiny_embedder: Path,
    tiny_adapters: dict[str, Path],
    runtime: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = load(tiny_embedder, runtime)
    loaded(first, "a", tiny_adapters["a"])
    want = first.forward(first.tokenize(TEXTS, "right"), ["a"] * len(TEXTS))

    def no_export(*args: object) -> dict[str, object]:
        raise AssertionError("the merged graph was exported again")

    monkeypatch.setattr(export, "_export", no_export)
    second = load(tiny_embedder, runtime)  # the base export is cached too
    loaded(second, "a", tiny_adapters["a"])
    got = second.forward(second.tokenize(TEXTS, "right"), ["a"] * len(TEXTS))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_eviction_frees_the_graph_and_reloading_answers_the_same(
    tiny_embedder: Path, tiny_adapters: dict[str, Path]
) -> None:
    graph = load(tiny_embedder, "openvino")
    resident = ResidentAdapters(1, lambda n, f: loaded(graph, n, f), graph.unload_adapter)
    encoded = graph.tokenize(TEXTS, "right")
    answers = []
    for name in ["a", "b", "a"]:  # cap 1: each switch unloads the other
        assert resident.ensure({name: tiny_adapters[name]}) == {}
        assert list(graph.adapters.resident) == [name]  # type: ignore[attr-defined]
        answers.append(graph.forward(encoded, [name] * len(TEXTS)))
    np.testing.assert_allclose(answers[2], answers[0], atol=1e-5)


def test_an_adapter_of_another_shape_fails_its_build_clearly(
    tiny_embedder: Path, tmp_path: Path
) -> None:
    wide = build_tiny_embedder(tmp_path / "wide", hidden=48)
    foreign = build_tiny_lora(wide, tmp_path / "foreign", seed=3)
    graph = load(tiny_embedder, "onnx")
    with pytest.raises(AdapterInvalid, match="does not fit model 'tiny'"):
        loaded(graph, "foreign", foreign)
    encoded = graph.tokenize(TEXTS[:2], "right")
    with pytest.raises(AdapterInvalid, match="'foreign' is not loaded"):
        graph.forward(encoded, ["foreign", None])
    assert graph.forward(encoded, [None, None]).shape == (2, 32)  # base rows still run


def test_a_cross_encoder_takes_no_adapters(
    tiny_reranker: Path, tiny_adapters: dict[str, Path]
) -> None:
    from embedder.core.jobs import Task

    graph = load_runtime(spec_for(tiny_reranker, "onnx", task=Task.RERANK), "cpu", 1)
    with pytest.raises(AdapterInvalid, match="takes no adapters"):
        graph.load_adapter("a", tiny_adapters["a"])
