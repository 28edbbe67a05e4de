"""ONNX Runtime and OpenVINO against the torch runtime on tiny random models: the same
ids, the same vectors and scores within each precision's tolerance, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedder.core.fleet import FleetError, Precision
from embedder.core.jobs import Task
from embedder.tasks.embed.runtimes import Runtime, load_runtime
from tests.embedder.tasks.embed.runtimes.conftest import TEXTS, spec_for, worst_cosine

# runtime, precision, the least worst-cosine to torch fp32 (tiny random models: plumbing,
# so reduced precisions only have to stay close-ish)
CASES = [
    ("onnx", "float32", 0.9999),
    ("onnx", "int8", 0.9),
    ("openvino", "float32", 0.9999),
    ("openvino", "bfloat16", 0.99),
    ("openvino", "int8", 0.8),
]
GRAPH_RUNTIMES = ["onnx", "openvino"]


def load(folder: Path, runtime: str, dtype: Precision = "float32", **fields: object) -> Runtime:
    return load_runtime(spec_for(folder, runtime, dtype, **fields), "cpu", 1)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def torch_embedder(tiny_embedder: Path) -> Runtime:
    return load(tiny_embedder, "torch")


@pytest.mark.parametrize(("runtime", "dtype", "least"), CASES)
def test_vectors_match_torch_fp32(
    tiny_embedder: Path, torch_embedder: Runtime, runtime: str, dtype: Precision, least: float
) -> None:
    graph = load(tiny_embedder, runtime, dtype)
    want = torch_embedder.forward(torch_embedder.tokenize(TEXTS, "right"))
    got = graph.forward(graph.tokenize(TEXTS, "right"))
    assert got.dtype == np.float32
    assert got.shape == want.shape == (len(TEXTS), 32)
    assert worst_cosine(got, want) >= least
    assert graph.info.kind == "bi-encoder" and graph.info.dimension == 32
    assert dtype in graph.info.dtype and runtime in graph.info.dtype


def test_auto_is_float32(tiny_embedder: Path) -> None:
    for runtime in GRAPH_RUNTIMES:
        assert load(tiny_embedder, runtime, "auto").info.dtype.startswith("float32")


def test_openvino_float32_is_pinned_to_f32(tiny_embedder: Path, torch_embedder: Runtime) -> None:
    """Unpinned, OpenVINO would run bf16 on this CPU; pinned, it stays as close as fp32."""
    graph = load(tiny_embedder, "openvino", "float32")
    assert graph.info.dtype == "float32 (openvino, f32 pinned)"
    want = torch_embedder.forward(torch_embedder.tokenize(TEXTS, "right"))
    assert worst_cosine(graph.forward(graph.tokenize(TEXTS, "right")), want) >= 0.99999


@pytest.mark.parametrize("runtime", GRAPH_RUNTIMES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_ids_are_the_torch_runtimes(
    tiny_embedder: Path, torch_embedder: Runtime, runtime: str, side: str
) -> None:
    graph = load(tiny_embedder, runtime)
    for prefix in ("", "query: "):
        want = torch_embedder.tokenize(TEXTS, side, prefix)  # type: ignore[arg-type]
        got = graph.tokenize(TEXTS, side, prefix)  # type: ignore[arg-type]
        assert got == want
        assert any(n > graph.info.max_tokens for n in got.full_lengths)  # truncation ran
    pairs = graph.tokenize_pairs("which fox", TEXTS, side)  # type: ignore[arg-type]
    assert pairs == torch_embedder.tokenize_pairs("which fox", TEXTS, side)  # type: ignore[arg-type]


@pytest.mark.parametrize("runtime", GRAPH_RUNTIMES)
def test_pooling_override_is_in_the_graph(tiny_embedder: Path, runtime: str) -> None:
    want_rt = load(tiny_embedder, "torch", pooling="cls")
    graph = load(tiny_embedder, runtime, pooling="cls")
    want = want_rt.forward(want_rt.tokenize(TEXTS, "right"))
    assert worst_cosine(graph.forward(graph.tokenize(TEXTS, "right")), want) >= 0.9999
    mean = load(tiny_embedder, runtime)
    assert worst_cosine(mean.forward(mean.tokenize(TEXTS, "right")), want) < 0.999


@pytest.mark.parametrize("runtime", GRAPH_RUNTIMES)
def test_cross_encoder_scores_match(tiny_reranker: Path, runtime: str) -> None:
    ref = load(tiny_reranker, "torch", task=Task.RERANK)
    graph = load(tiny_reranker, runtime, task=Task.RERANK)
    encoded = ref.tokenize_pairs("which fox", TEXTS, "right")
    assert graph.tokenize_pairs("which fox", TEXTS, "right") == encoded
    want, got = ref.forward(encoded), graph.forward(encoded)
    assert got.shape == want.shape == (len(TEXTS),)
    np.testing.assert_allclose(got, want, atol=1e-4 * float(np.abs(want).max()))
    assert graph.info.kind == "cross-encoder" and graph.info.dimension is None


@pytest.mark.parametrize(
    ("runtime", "dtype", "says"),
    [
        ("onnx", "bfloat16", "no bf16 arithmetic; use float32 or int8, or runtime torch"),
        ("onnx", "bfloat16-autocast", "no bf16 arithmetic"),
        ("onnx", "float16", "use float32 or int8"),
        ("openvino", "bfloat16-autocast", "write dtype bfloat16"),
        ("openvino", "float16", "use float32 or bfloat16 or int8, or runtime torch"),
    ],
)
def test_precisions_it_cannot_run_are_refused(
    tiny_embedder: Path, runtime: str, dtype: Precision, says: str
) -> None:
    with pytest.raises(FleetError, match=f"runtime '{runtime}' cannot run dtype '{dtype}'") as e:
        load(tiny_embedder, runtime, dtype)
    assert says in e.value.message


def test_openvino_refuses_cuda(tiny_embedder: Path) -> None:
    with pytest.raises(FleetError, match="compiles for the CPU; on cuda use runtime torch"):
        load_runtime(spec_for(tiny_embedder, "openvino"), "cuda", 1)
