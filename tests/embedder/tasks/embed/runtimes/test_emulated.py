"""The emulated device: the real tokenizer and dimension of a model folder, a forward that
costs nothing or a calibrated sleep (plumbing only; no speed claims here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedder.tasks.embed.batching import micro_batches
from embedder.core.errors import AdapterInvalid
from embedder.core.fleet import Fleet, ModelSpec
from embedder.tasks.fleet import load_fleet
from embedder.core.jobs import Task
from embedder.tasks.embed.runtimes import RUNTIMES, Runtime, load_runtime
from embedder.tasks.embed.runtimes.emulated import (
    FIXED_MS_ENV,
    MS_PER_1K_TOKENS_ENV,
    MS_PER_SEQUENCE_ENV,
    SLOWDOWN_ENV,
    EmulatedRuntime,
    load,
)
from tests.gateway.conftest import hub_offline
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

TEXTS = [
    "short",
    "A longer English sentence about shipping schedules and the weather in coastal towns.",
    "Wer vorsätzlich das Eigentum eines anderen verletzt, ist zum Ersatz verpflichtet.",
    " ".join(f"word{i}" for i in range(120)),  # over the tiny model's 64 tokens
]


def on(spec: ModelSpec, runtime: str, **profile: object) -> ModelSpec:
    cpu = spec.profile("cpu").model_copy(update={"runtime": runtime, **profile})
    return spec.model_copy(update={"profiles": {"cpu": cpu}})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    folder = tmp_path_factory.mktemp("tiny-emulated")
    with hub_offline():
        model_dir = build_tiny_embedder(folder)
    fleet = Fleet.model_validate({"models": _read_models(tiny_fleet_file(folder, model_dir))})
    return fleet.get("tiny")


def _read_models(path: Path) -> dict[str, object]:
    import yaml

    models: dict[str, object] = yaml.safe_load(path.read_text(encoding="utf-8"))["models"]
    return models


@pytest.fixture(scope="module")
def both(tiny: ModelSpec) -> tuple[Runtime, Runtime]:
    with hub_offline():
        return load_runtime(on(tiny, "torch"), "cpu", 1), load_runtime(
            on(tiny, "emulated"), "cpu", 1
        )


def test_the_registry_names_the_emulated_runtime(both: tuple[Runtime, Runtime]) -> None:
    assert "emulated" in RUNTIMES
    assert isinstance(both[1], EmulatedRuntime)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("prefix", ["", "query: "])
def test_ids_equal_the_torch_runtimes(
    both: tuple[Runtime, Runtime], side: str, prefix: str
) -> None:
    torch_rt, emulated = both
    want = torch_rt.tokenize(TEXTS, side, prefix=prefix)  # type: ignore[arg-type]
    got = emulated.tokenize(TEXTS, side, prefix=prefix)  # type: ignore[arg-type]
    assert got == want
    assert max(len(ids) for ids in got.ids) == 64  # the over-long text was cut
    pairs = emulated.tokenize_pairs("a query", TEXTS, side)  # type: ignore[arg-type]
    assert pairs == torch_rt.tokenize_pairs("a query", TEXTS, side)  # type: ignore[arg-type]


def test_dimension_and_window_are_the_folders(both: tuple[Runtime, Runtime]) -> None:
    torch_rt, emulated = both
    assert emulated.info.dimension == torch_rt.info.dimension == 32
    assert emulated.info.max_tokens == torch_rt.info.max_tokens == 64
    assert emulated.info.kind == "bi-encoder"
    assert emulated.info.device == "emulated"


def test_the_real_minilm_folder_gives_its_dimension_and_window() -> None:
    spec = load_fleet().get("all-minilm-l6-v2")
    with hub_offline():
        runtime = load(spec, "cpu", 1)
    assert (runtime.info.dimension, runtime.info.max_tokens) == (384, 256)


def test_vectors_are_a_deterministic_function_of_the_ids(
    both: tuple[Runtime, Runtime], tiny: ModelSpec
) -> None:
    emulated = both[1]
    encoded = emulated.tokenize(TEXTS, "right")
    out = emulated.forward(encoded)
    assert out.shape == (len(TEXTS), 32) and out.dtype == np.float32
    with hub_offline():
        again = load(on(tiny, "emulated"), "cpu", 1).forward(encoded)  # another instance
    np.testing.assert_array_equal(out, again)
    # Each row depends on its own ids only: alone or in another batch, the same vector.
    np.testing.assert_array_equal(
        emulated.forward(emulated.tokenize(TEXTS[1:2], "right"))[0], out[1]
    )
    assert len({row.tobytes() for row in out}) == len(TEXTS)  # distinct texts, distinct rows


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def test_one_sleep_per_forward_for_its_passes_of_padded_tokens(tiny: ModelSpec) -> None:
    sleeps = Sleeps()
    with hub_offline():
        base = load(on(tiny, "emulated"), "cpu", 1)
    runtime = EmulatedRuntime(
        tiny,
        base.tokenizer,
        dimension=32,
        max_tokens=64,
        forward_tokens=96,
        forward_max_sequences=3,
        ms_per_1k_tokens=2.5,
        sleep=sleeps,
    )
    encoded = runtime.tokenize(TEXTS * 2, "right")
    runtime.forward(encoded)
    lengths = [len(ids) for ids in encoded.ids]
    passes = micro_batches(lengths, 96, 3)
    shapes = [(len(rows), max(lengths[i] for i in rows)) for rows in passes]
    assert runtime.last_passes == shapes
    assert len(shapes) > 1  # the pass limits cut this batch
    assert sleeps.calls == pytest.approx([sum(n * width for n, width in shapes) * 2.5e-6])


def test_the_calibrated_cost_is_fixed_plus_padded_tokens_plus_sequences_times_slowdown(
    tiny: ModelSpec,
) -> None:
    sleeps = Sleeps()
    with hub_offline():
        base = load(on(tiny, "emulated"), "cpu", 1)
    runtime = EmulatedRuntime(
        tiny, base.tokenizer, dimension=32, max_tokens=64, forward_tokens=96,
        forward_max_sequences=3, ms_per_1k_tokens=2.0, fixed_ms=5.0, ms_per_sequence=0.5,
        slowdown=3.0, sleep=sleeps,
    )  # fmt: skip
    encoded = runtime.tokenize(TEXTS * 2, "right")
    runtime.forward(encoded)
    padded = sum(n * width for n, width in runtime.last_passes)
    want_ms = 3.0 * (5.0 + 2.0 * padded / 1e3 + 0.5 * len(TEXTS) * 2)
    assert sleeps.calls == pytest.approx([want_ms / 1e3])
    assert runtime.cost_s([]) == 0.0  # an empty batch costs nothing, not the fixed cost
    runtime.forward(runtime.tokenize(TEXTS[:1], "right"))
    assert sleeps.calls[-1] == pytest.approx(3.0 * (5.0 + 2.0 * 3 / 1e3 + 0.5) / 1e3)


def test_no_sleep_by_default(both: tuple[Runtime, Runtime]) -> None:
    emulated = both[1]
    assert isinstance(emulated, EmulatedRuntime)
    assert emulated.ms_per_1k_tokens == 0.0
    sleeps = Sleeps()
    emulated.sleep = sleeps
    emulated.forward(emulated.tokenize(TEXTS, "right"))
    assert sleeps.calls == []


def test_the_sleep_knob_comes_from_the_environment(
    tiny: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MS_PER_1K_TOKENS_ENV, "1.5")
    monkeypatch.setenv(FIXED_MS_ENV, "4")
    monkeypatch.setenv(MS_PER_SEQUENCE_ENV, "0.25")
    monkeypatch.setenv(SLOWDOWN_ENV, "3")
    with hub_offline():
        runtime = load(tiny, "cpu", 1)
    assert (runtime.ms_per_1k_tokens, runtime.fixed_ms, runtime.ms_per_sequence) == (1.5, 4, 0.25)
    assert runtime.slowdown == 3
    for name, bad in ((MS_PER_1K_TOKENS_ENV, "fast"), (MS_PER_1K_TOKENS_ENV, "-1"),
                      (FIXED_MS_ENV, "-2"), (SLOWDOWN_ENV, "0")):  # fmt: skip
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name), hub_offline():
            load(tiny, "cpu", 1)
        monkeypatch.delenv(name)


def test_a_worker_on_the_emulated_device_never_imports_torch() -> None:
    import subprocess
    import sys

    spec = load_fleet().get("all-minilm-l6-v2")
    code = (
        "import sys; from embedder.tasks.fleet import load_fleet; from embedder.tasks.embed.runtimes.emulated "
        "import load; rt = load(load_fleet().get('all-minilm-l6-v2'), 'cpu', 1); "
        "print(len(rt.tokenize(['a short text'], 'right').ids[0]), "
        "'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["5", "False", "False"], (spec.name, out.stderr)


def test_a_rerank_model_gives_one_score_per_pair(tiny: ModelSpec) -> None:
    with hub_offline():
        runtime = load(tiny.model_copy(update={"task": Task.RERANK}), "cpu", 1)
    assert runtime.info.kind == "cross-encoder" and runtime.info.dimension is None
    out = runtime.forward(runtime.tokenize_pairs("q", TEXTS, "right"))
    assert out.shape == (len(TEXTS),)


def test_adapters_are_refused_with_a_clear_error(both: tuple[Runtime, Runtime]) -> None:
    with pytest.raises(AdapterInvalid, match="emulated device serves no adapters"):
        both[1].load_adapter("legal", Path("/nowhere"))
