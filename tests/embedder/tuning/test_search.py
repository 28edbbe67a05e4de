"""The search and its guard over fake runtimes whose outputs are perturbed
deterministically and whose speed is a fake clock: which candidate wins, which are
refused and why. Plumbing only: no speed or quality claim about a real runtime."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from numpy.typing import NDArray

from embedder.core.fleet import DeviceKind, ModelSpec
from embedder.tasks.embed.runtimes import Encoded
from embedder.tuning import measure
from embedder.tuning.candidates import Plan
from embedder.tuning.measure import Workload
from embedder.tuning.retrieval import LabelledSet
from embedder.tuning.search import Search, TuneError
from lora.metrics import evaluate
from tests.fakes import FakeRuntime, fake_fleet

MARKER = "statute"  # a word only the labelled passages carry


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Behaviour:
    seconds_per_token: float
    noise: float = 0.0  # relative, per text, deterministic
    garble_marked: bool = False  # texts with MARKER get unrelated vectors
    fails: bool = False


class PerturbedRuntime(FakeRuntime):
    """Bag-of-words vectors (texts sharing words are close, so retrieval works), timed by
    the fake clock, perturbed as its Behaviour says."""

    def __init__(self, spec: ModelSpec, behaviour: Behaviour, clock: Clock) -> None:
        super().__init__(spec, dimension=32)
        self.behaviour, self.clock = behaviour, clock
        self.marker = FakeRuntime.word_ids(MARKER)[1]

    def vector_of_ids(self, ids: Sequence[int]) -> NDArray[np.float32]:
        words = [np.random.default_rng(i).standard_normal(self.dimension) for i in ids[1:-1]]
        return np.sum(words, axis=0).astype(np.float32)

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> NDArray[np.float32]:
        self.clock.now += self.behaviour.seconds_per_token * encoded.tokens
        out = super().forward(encoded, adapters)
        for row, ids in enumerate(encoded.ids):
            rng = np.random.default_rng(zlib.crc32(np.asarray(ids).tobytes()) + 7)
            scale = float(np.linalg.norm(out[row]))
            if self.behaviour.garble_marked and self.marker in ids:
                out[row] = rng.standard_normal(self.dimension) * scale
            else:
                out[row] += self.behaviour.noise * scale * rng.standard_normal(self.dimension)
        return out


def loader_for(
    behaviours: dict[tuple[str, str], Behaviour], clock: Clock
) -> tuple[list[tuple[str, str, int]], object]:
    loads: list[tuple[str, str, int]] = []

    def load(spec: ModelSpec, device: DeviceKind, threads: int) -> PerturbedRuntime:
        profile = spec.profile(device)
        behaviour = behaviours[(profile.runtime, profile.dtype)]
        loads.append((profile.runtime, profile.dtype, threads))
        if behaviour.fails:
            raise ImportError("no module named 'fakeruntime'")
        return PerturbedRuntime(spec, behaviour, clock)

    return loads, load


CALIBRATION = Workload([" ".join(f"w{i}x{j}" for j in range(3 + i % 9)) for i in range(24)])
LABELLED = LabelledSet(
    "fake",
    queries={f"q{i}": f"topic{i} subject{i} area{i}" for i in range(20)},
    corpus={f"d{i}": f"topic{i} subject{i} area{i} {MARKER}" for i in range(20)},
    qrels={f"q{i}": {f"d{i}": 1} for i in range(20)},
    metric=lambda run, qrels: evaluate(run, qrels)["ndcg@10"],
)
TINY = Plan(
    texts=24,
    repeats=2,
    finalists=2,
    shapes=((64, 8), (128, 16)),
    batch_tokens=(128, 256),
    threads=(1, 2),
)


def search(
    behaviours: dict[tuple[str, str], Behaviour], monkeypatch: pytest.MonkeyPatch, plan: Plan = TINY
) -> tuple[Search, list[tuple[str, str, int]]]:
    clock = Clock()
    monkeypatch.setattr(measure, "perf_counter", clock)
    loads, load = loader_for(behaviours, clock)
    spec = fake_fleet("m", max_tokens=64).get("m")
    made = Search(spec, "cpu", load, CALIBRATION, threads=2, cores=2, plan=plan, labelled=LABELLED)  # type: ignore[arg-type]
    return made, loads


BEHAVIOURS = {
    ("torch", "float32"): Behaviour(1e-3),
    ("fake", "bfloat16"): Behaviour(4e-4, noise=1e-4),  # faster, close: passes
    ("fake", "float16"): Behaviour(1e-4, noise=0.2),  # fastest, moves vectors
    ("fake", "int8"): Behaviour(1e-4, noise=1e-5, garble_marked=True),  # cosine ok, ranks wrong
    ("absent", "bfloat16"): Behaviour(1e-4, fails=True),
}


@pytest.mark.usefixtures("registry")
def test_the_fastest_candidate_that_passes_the_guard_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    tuner, _ = search(BEHAVIOURS, monkeypatch)
    outcome = tuner.run()
    by = {
        (t.candidate.runtime, t.candidate.dtype): t
        for t in outcome.trials
        if t.stage == "runtime x precision"
    }
    assert outcome.chosen.candidate.runtime == "fake"
    assert outcome.chosen.candidate.dtype == "bfloat16"
    assert outcome.chosen.passed
    assert outcome.reference.candidate.dtype == "float32"
    assert outcome.runner_up is not None and outcome.runner_up.candidate.runtime == "torch"
    refused = {k: t.refused or "" for k, t in by.items()}
    assert "worst cosine" in refused[("fake", "float16")]
    assert "nDCG@10" in refused[("fake", "int8")]  # its cosine passed
    assert by[("fake", "int8")].verdict is not None
    assert by[("fake", "int8")].verdict.worst_cosine >= 0.999
    assert outcome.ndcg_fp32 is not None and outcome.ndcg_fp32 > 0.9
    assert refused[("absent", "bfloat16")].startswith("did not load: ImportError")
    assert refused[("torch", "float32")] == "" and refused[("fake", "bfloat16")] == ""


@pytest.mark.usefixtures("registry")
def test_int8_that_keeps_ranking_passes_and_every_stage_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good_int8 = {**BEHAVIOURS, ("fake", "int8"): Behaviour(1e-4, noise=1e-5)}
    tuner, loads = search(good_int8, monkeypatch)
    outcome = tuner.run()
    assert (outcome.chosen.candidate.runtime, outcome.chosen.candidate.dtype) == ("fake", "int8")
    assert outcome.chosen.verdict is not None and outcome.chosen.verdict.ndcg is not None
    stages = [t.stage for t in outcome.trials]
    assert "pass shape, fake/int8" in stages and "batch budget" in stages and "threads" in stages
    # The clock charges per token, so threads tie: the fewer win. Budgets tie: the smaller.
    assert outcome.chosen.candidate.threads == 1
    assert outcome.chosen.candidate.max_batch_tokens == min(
        t.candidate.max_batch_tokens for t in outcome.trials if t.stage == "batch budget"
    )
    assert ("fake", "int8", 1) in loads  # each thread count loaded with its own threads
    # fp32 is timed again in the last stage's rounds, for the speed-up that is recorded.
    assert outcome.fp32.stage == "threads" and outcome.fp32.candidate.dtype == "float32"
    assert outcome.chosen.candidate.dtype == "int8"  # fp32 timed there, never chosen


@pytest.mark.usefixtures("registry")
def test_without_a_labelled_set_int8_is_not_timed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It could not pass the guard without a retrieval check: loading and timing it would
    only cost a background tune its budget."""
    good_int8 = {**BEHAVIOURS, ("fake", "int8"): Behaviour(1e-4, noise=1e-5)}
    tuner, _ = search(good_int8, monkeypatch)
    tuner.labelled = None
    with caplog.at_level(logging.INFO, logger="embedder.tuning.search"):
        outcome = tuner.run()
    assert not any(t.candidate.dtype == "int8" for t in outcome.trials)
    assert outcome.chosen.candidate.dtype != "int8"
    assert "int8 is not timed" in caplog.text


@pytest.mark.usefixtures("registry")
def test_a_broken_reference_stops_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = {**BEHAVIOURS, ("torch", "float32"): Behaviour(1e-3, fails=True)}
    tuner, _ = search(broken, monkeypatch)
    with pytest.raises(TuneError, match="reference failed"):
        tuner.run()


@pytest.mark.usefixtures("registry")
def test_the_report_table_and_the_tuned_entry_render(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from flotilla.tune import entry, table

    tuner, _ = search(BEHAVIOURS, monkeypatch)
    outcome = tuner.run()
    console = Console(width=200, record=True)
    console.print(table(outcome))
    text = console.export_text()
    assert "chosen" in text and "refused: worst cosine" in text and "refused: nDCG@10" in text
    made = entry(outcome, "fake texts", "flotilla tune m")
    assert made.profile == outcome.chosen.candidate.fields()
    assert made.measured.fp32_tokens_per_s == round(outcome.fp32.tokens_per_s or 0, 1)
    assert made.measured.runner_up is not None


# -- timing on a quiet device, and saying why fewer threads ---------------------------


@pytest.mark.usefixtures("registry")
def test_a_disturbed_round_is_timed_again_and_the_outcome_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from embedder.tuning.quiet import Quiet
    from flotilla.tune import entry
    from tests.embedder.tuning.test_quiet import ScriptedMeter, Sleeps

    tuner, _ = search(BEHAVIOURS, monkeypatch)
    # The first counted round: quiet before it, 1.5 cores beside it; then quiet throughout.
    meter = ScriptedMeter([0.0, 1.5])
    tuner.quiet = Quiet(meter, sleep=Sleeps())
    outcome = tuner.run()
    assert outcome.load.disturbed_rounds == 1 and not outcome.load.noisy
    assert outcome.load.max_other_cores == 0.0  # the kept rounds ran beside nothing
    first = [t for t in outcome.trials if t.stage == "runtime x precision"]
    assert {t.other_load_cores for t in first} == {0.0}
    rounds = TINY.repeats * len({t.stage for t in outcome.trials})
    assert meter.intervals == 2 * (rounds + 1)  # a check before and during each, one more
    assert outcome.chosen.candidate.dtype == "bfloat16"  # the search itself is unchanged
    measured = entry(outcome, "fake texts", "flotilla tune m").measured
    assert (measured.disturbed_rounds, measured.other_load_cores, measured.noisy) == (1, 0.0, None)


@pytest.mark.usefixtures("registry")
def test_a_search_without_quiet_checks_says_the_load_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flotilla.tune import entry

    tuner, _ = search(BEHAVIOURS, monkeypatch)
    outcome = tuner.run()
    assert not outcome.load.known and outcome.load.max_other_cores is None
    measured = entry(outcome, "fake texts", "flotilla tune m").measured
    assert measured.other_load_cores is None and measured.disturbed_rounds is None


@pytest.mark.usefixtures("registry")
def test_fewer_threads_than_cores_say_why_with_the_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flotilla.tune import entry

    tuner, _ = search(BEHAVIOURS, monkeypatch)
    outcome = tuner.run()
    # The fake clock charges per token: 1 and 2 threads tie, and the fewer win.
    assert outcome.chosen.candidate.threads == 1
    by = {t.candidate.threads: t for t in outcome.trials if t.stage == "threads"
          and t.candidate.dtype == "bfloat16"}  # fmt: skip
    assert outcome.threads_why is not None
    assert outcome.threads_why.startswith(f"1 thread: {by[1].tokens_per_s:,.0f} tok/s")
    assert f"within 3% of 2 threads' {by[2].tokens_per_s:,.0f}" in outcome.threads_why
    assert entry(outcome, "t", "c").measured.threads_why == outcome.threads_why


def test_threads_why_names_the_tie_or_the_fastest() -> None:
    from embedder.tuning.candidates import Candidate
    from embedder.tuning.guard import Verdict
    from embedder.tuning.search import Trial, threads_why

    base = Candidate("torch", "bfloat16", 1, 1024, 16, 4096)
    passed = Verdict(worst_cosine=1.0, ndcg=None, refused=None)

    def trial(threads: int, tokens_per_s: float) -> Trial:
        return Trial("threads", base.but(threads=threads), tokens_per_s, passed)

    one, two = trial(1, 3150.0), trial(2, 3180.0)
    assert threads_why(one, [one, two], cores=2, tie=0.03) == (
        "1 thread: 3,150 tok/s within 3% of 2 threads' 3,180 (the tie rule prefers fewer)"
    )
    faster = trial(1, 3500.0)
    assert threads_why(faster, [faster, two], cores=2, tie=0.03) == (
        "1 thread: 3,500 tok/s, the fastest (2 threads: 3,180)"
    )
    assert threads_why(two, [one, two], cores=2, tie=0.03) is None  # every core used
    assert threads_why(Trial("batch budget", base, 1.0, passed), [], cores=2, tie=0.03) is None


def test_a_gpu_gets_its_own_wider_plan() -> None:
    from embedder.tuning.candidates import CUDA, QUICK, Plan, plan_for

    assert plan_for("cpu") == Plan() and plan_for("cpu", quick=True) == QUICK
    gpu = plan_for("cuda")
    assert gpu is CUDA and not gpu.quick
    assert max(gpu.shapes) == (32768, 512) and max(gpu.batch_tokens) >= 65536
    assert max(gpu.shapes) > max(Plan().shapes) and gpu.texts > Plan().texts
    short = plan_for("cuda", quick=True)
    # The quick plan tries two of the GPU's shapes and budgets, as QUICK does of the CPU's.
    assert short.quick and short.repeats == QUICK.repeats
    assert set(short.shapes) <= set(gpu.shapes) and len(short.shapes) == len(QUICK.shapes)
    assert min(short.batch_tokens) > max(QUICK.batch_tokens)
