"""The rows bench.engine runs: generic over the runtime and precision registries."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.candidates import (
    Candidate,
    load_each,
    precisions_of,
    profile_candidate,
    runtime_candidates,
    tuned_candidate,
    with_profile,
)
from embedder.core.device import fingerprint
from embedder.core.fleet import ModelSpec
from embedder.tuned import TunedProfiles
from tests.fakes import fake_fleet


@pytest.fixture
def spec() -> ModelSpec:
    return fake_fleet("m").get("m")


def test_every_runtime_times_its_precisions_with_the_profile_overridden(spec: ModelSpec) -> None:
    registry = {"torch": "x:load", "onnx": "y:load", "emulated": "z:load"}
    offered = {"torch": ["float32", "bfloat16"], "onnx": ["float32", "int8"]}
    chosen = runtime_candidates(spec, "cpu", registry, lambda r, d: offered[r])
    assert [c.key for c in chosen] == [
        "torch-float32",
        "torch-bfloat16",
        "onnx-float32",
        "onnx-int8",
    ]  # the emulated runtime has no model: no engine row
    onnx_int8 = chosen[-1].spec.profile("cpu")
    assert (onnx_int8.runtime, onnx_int8.dtype) == ("onnx", "int8")
    # the other fields of the profile are kept, the spec itself is untouched
    assert onnx_int8.max_batch_tokens == spec.profile("cpu").max_batch_tokens == 512
    assert spec.profile("cpu").runtime == "torch"


def test_only_keeps_the_named_runtimes(spec: ModelSpec) -> None:
    registry = {"torch": "x:load", "onnx": "y:load"}
    chosen = runtime_candidates(spec, "cpu", registry, lambda r, d: ["float32"], only=["onnx"])
    assert [c.key for c in chosen] == ["onnx-float32"]


def test_precisions_come_from_the_registry_per_device() -> None:
    registry = {"onnx": {"cpu": ("auto", "float32", "int8"), "cuda": ("float32",)}}
    assert precisions_of("onnx", "cpu", registry) == ["float32", "int8"]
    assert precisions_of("onnx", "cuda", registry) == ["float32"]
    assert precisions_of("emulated", "cpu", registry) == []


def test_the_real_registry_offers_cudas_float16_only_on_cuda() -> None:
    on_cpu = precisions_of("torch", "cpu")
    assert set(on_cpu) == {"float32", "bfloat16", "bfloat16-autocast"}
    assert "float16" in precisions_of("torch", "cuda")
    assert precisions_of("emulated", "cpu") == []


def test_with_profile_validates_the_fields(spec: ModelSpec) -> None:
    with pytest.raises(ValueError):
        with_profile(spec, "cpu", dtype="float64")
    with pytest.raises(ValueError):
        with_profile(spec, "cpu", no_such_knob=1)
    cuda = with_profile(spec, "cuda", dtype="float16")
    assert cuda.profile("cuda").dtype == "float16"
    assert cuda.profile("cpu") == spec.profile("cpu")


def test_a_candidate_that_fails_to_load_is_skipped_with_its_reason(spec: ModelSpec) -> None:
    good = Candidate("torch-float32", "ok", spec)
    bad = Candidate("onnx-bfloat16", "refuses", with_profile(spec, "cpu", runtime="onnx"))

    def load(s: ModelSpec) -> str:
        if s.profile("cpu").runtime == "onnx":
            raise ValueError("bf16 is not on ONNX Runtime's CPU provider\nmore")
        return "runtime"

    loaded, skipped = load_each([good, bad], load)
    assert [(c.key, r) for c, r in loaded] == [("torch-float32", "runtime")]
    assert skipped == [("onnx-bfloat16", "ValueError: bf16 is not on ONNX Runtime's CPU provider")]


def test_profile_file_yaml_and_json(spec: ModelSpec, tmp_path: Path) -> None:
    yml = tmp_path / "p.yaml"
    yml.write_text("dtype: bfloat16\nforward_tokens: 4096\n")
    got = profile_candidate(spec, "cpu", yml).spec.profile("cpu")
    assert (got.dtype, got.forward_tokens, got.max_batch_requests) == ("bfloat16", 4096, 16)
    js = tmp_path / "p.json"
    js.write_text('{"threads": 1}')
    assert profile_candidate(spec, "cpu", js).spec.profile("cpu").threads == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "a mapping"),
        ("forward_tokenz: 1\n", "unknown profile fields"),
        ("dtype: float64\n", "dtype"),
    ],
)
def test_a_bad_profile_file_is_a_clear_error(
    spec: ModelSpec, tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit, match=message):
        profile_candidate(spec, "cpu", path)


def test_tuned_row_is_the_profile_serve_would_choose(spec: ModelSpec) -> None:
    fields = {"runtime": "openvino", "dtype": "bfloat16", "forward_tokens": 1024}
    tuned = TunedProfiles.model_validate(
        {
            "models": {
                spec.name: {
                    fingerprint("cpu"): {
                        "profile": fields,
                        "measured": {"tokens_per_s": 1.0, "worst_cosine": 1.0},
                    }
                }
            }
        }
    )
    got = tuned_candidate(spec, "cpu", tuned)
    assert isinstance(got, Candidate) and got.key == "tuned"
    assert got.spec.profile("cpu").model_dump(include=set(fields)) == fields
    missing = tuned_candidate(spec, "cpu", TunedProfiles())
    assert isinstance(missing, str) and "no tuned profile for cpu:" in missing
