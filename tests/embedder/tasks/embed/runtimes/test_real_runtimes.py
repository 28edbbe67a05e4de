"""The real all-MiniLM-L6-v2 (bundled fleet) on every exported runtime against torch fp32."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from embedder.core.fleet import ModelSpec, Precision

from embedder.tasks.fleet import load_fleet
from embedder.tasks.embed.runtimes import load_runtime
from tests.embedder.tasks.embed.runtimes.conftest import worst_cosine

pytestmark = pytest.mark.slow

TEXTS = [
    "How do I reset my password?",
    "flotilla serves fleets of small models",
    "The quick brown fox jumps over the lazy dog.",
    "Wer vorsätzlich oder fahrlässig das Leben, den Körper, die Gesundheit, die Freiheit, "
    "das Eigentum oder ein sonstiges Recht eines anderen widerrechtlich verletzt, ist dem "
    "anderen zum Ersatz des daraus entstehenden Schadens verpflichtet.",
    "Die Kündigung des Arbeitsverhältnisses bedarf zu ihrer Wirksamkeit der Schriftform.",
] + [
    " ".join(
        ["Researchers measured how quickly small models answer questions about tax law,"]
        * (1 + i % 9)
    )
    + f" Case {i}: shipping schedules and the weather in coastal town number {i}."
    for i in range(31)
]


def minilm(runtime: str, dtype: Precision) -> ModelSpec:
    spec = load_fleet().models["all-minilm-l6-v2"]
    profile = spec.profile("cpu").model_copy(update={"runtime": runtime, "dtype": dtype})
    return spec.model_copy(update={"profiles": {"cpu": profile}})


def vectors(runtime: str, dtype: Precision) -> NDArray[np.float32]:
    rt = load_runtime(minilm(runtime, dtype), "cpu", 2)
    return rt.forward(rt.tokenize(TEXTS, "right"))


@pytest.fixture(scope="module")
def reference() -> NDArray[np.float32]:
    return vectors("torch", "float32")


@pytest.mark.parametrize(("runtime", "least"), [("onnx", 0.9999), ("openvino", 0.99999)])
def test_float32_matches_torch(reference: NDArray[np.float32], runtime: str, least: float) -> None:
    assert worst_cosine(vectors(runtime, "float32"), reference) >= least


@pytest.mark.parametrize(
    ("runtime", "dtype"), [("openvino", "bfloat16"), ("onnx", "int8"), ("openvino", "int8")]
)
def test_reduced_precisions_report_their_worst_cosine(
    reference: NDArray[np.float32], runtime: str, dtype: Precision
) -> None:
    """No threshold: the tuner's guard decides whether they serve. Run with -s to read."""
    cosine = worst_cosine(vectors(runtime, dtype), reference)
    print(f"all-MiniLM-L6-v2 {runtime} {dtype}: worst cosine to torch fp32 {cosine:.5f}")
    assert 0.5 < cosine < 1.0  # it ran, on the model, and reduced precision shows
