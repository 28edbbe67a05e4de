"""The torch runtime's precisions on a CPU (tiny BERT: plumbing, not speed): bf16 weights
apart from bf16 autocast, `auto` picking among the three within the accuracy guard, and
the precisions it does not offer refused with what to use instead."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numpy.typing import NDArray

from embedder.core.fleet import FleetError, ModelSpec, Precision

from embedder.tasks.fleet import load_fleet
from embedder.tasks.embed.runtimes import MIN_COSINE, load_runtime
from embedder.tasks.embed.runtimes.torch_st import CPU_PRECISIONS, TorchRuntime, cpu_has_bf16
from tests.gateway.conftest import hub_offline
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

TEXTS = ["short", "Der Vermieter hat die Mietsache instand zu halten.", "a b c " * 20]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    folder = tmp_path_factory.mktemp("tiny-precision")
    with hub_offline():
        model_dir = build_tiny_embedder(folder)
    return load_fleet(tiny_fleet_file(folder, model_dir)).get("tiny")


def with_dtype(spec: ModelSpec, dtype: Precision) -> ModelSpec:
    profile = spec.profile("cpu").model_copy(update={"dtype": dtype})
    return spec.model_copy(update={"profiles": {"cpu": profile}})


def vectors(runtime: TorchRuntime) -> NDArray[np.float32]:
    out = runtime.forward(runtime.tokenize(TEXTS, "right"))
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def load(spec: ModelSpec, dtype: Precision) -> TorchRuntime:
    with hub_offline():
        runtime = load_runtime(with_dtype(spec, dtype), "cpu", 1)
    assert isinstance(runtime, TorchRuntime)
    return runtime


def test_bf16_weights_and_bf16_autocast_are_different_things(tiny: ModelSpec) -> None:
    weights = load(tiny, "bfloat16")
    autocast = load(tiny, "bfloat16-autocast")
    assert next(weights.module.parameters()).dtype == torch.bfloat16
    assert weights.autocast is None and weights.info.dtype == "bfloat16"
    assert next(autocast.module.parameters()).dtype == torch.float32
    assert autocast.autocast == torch.bfloat16
    assert autocast.info.dtype == "bfloat16-autocast (float32 weights)"
    fp32 = vectors(load(tiny, "float32"))
    for runtime in (weights, autocast):
        out = vectors(runtime)
        assert out.dtype == np.float32
        assert float((out * fp32).sum(axis=1).min()) > 0.99  # the same model, less precise


def test_auto_picks_a_cpu_precision_within_the_guard(tiny: ModelSpec) -> None:
    runtime = load(tiny, "auto")
    chosen = runtime.info.dtype.split(" ")[0]
    assert chosen in CPU_PRECISIONS
    if not cpu_has_bf16():
        assert chosen == "float32"
    fp32 = vectors(load(tiny, "float32"))
    assert float((vectors(runtime) * fp32).sum(axis=1).min()) >= MIN_COSINE


@pytest.mark.parametrize(
    ("dtype", "advice"), [("int8", "runtime onnx or openvino"), ("float16", "runs on CUDA")]
)
def test_precisions_it_lacks_are_refused_with_what_to_use(
    tiny: ModelSpec, dtype: Precision, advice: str
) -> None:
    with pytest.raises(FleetError, match=advice):
        load(tiny, dtype)
