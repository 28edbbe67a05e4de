"""The search: runtime x precision, then pass shape, then batch budget, then threads,
each stage narrowing the next, every candidate guarded.

Pruning keeps it to minutes: a model's precision decides most of its speed, so
precisions are compared at the fleet's own shape first and only the best
``plan.finalists`` go on to the shapes; the batch budget and threads are tuned last,
around the winner. Candidates of a stage are timed interleaved, best of
``plan.repeats`` rounds, so a burst of load from another process on a shared machine
slows all of them alike rather than one. A candidate that fails to load (a runtime
whose package is missing, a precision it refuses) is reported with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from embedder.core.errors import FlotillaError
from embedder.core.fleet import DeviceKind
from embedder.core.jobs import Task
from embedder.tasks.embed.runtimes import Runtime, worst_cosine
from embedder.tasks.embed.spec import EncoderSpec
from embedder.tuning.candidates import Candidate, Plan, precisions, thread_counts
from embedder.tuning.guard import Verdict, judge, needs_retrieval_check
from embedder.tuning.measure import Workload, batches, timed_pass
from embedder.tuning.quiet import LoadSeen, Quieting, Unwatched
from embedder.tuning.retrieval import LabelledSet, ndcg

log = logging.getLogger(__name__)

Loader = Callable[[EncoderSpec, DeviceKind, int], Runtime]
REFERENCE = ("torch", "float32")


class TuneError(FlotillaError):
    """Tuning cannot go on: no reference, nothing passed the guard, a task it cannot tune."""

    code = "tune_error"


class Progress(Protocol):
    def stage(self, name: str, steps: int) -> None: ...

    def advance(self, label: str) -> None: ...


class NoProgress:
    def stage(self, name: str, steps: int) -> None:
        pass  # the search logs each stage itself

    def advance(self, label: str) -> None:
        pass


@dataclass(slots=True)
class Trial:
    stage: str
    candidate: Candidate
    tokens_per_s: float | None = None
    verdict: Verdict | None = None
    error: str | None = None  # it did not load or run
    other_load_cores: float | None = None  # the most seen during its stage's kept rounds

    @property
    def refused(self) -> str | None:
        return self.error or (self.verdict.refused if self.verdict else "not measured")

    @property
    def passed(self) -> bool:
        return self.refused is None


@dataclass(slots=True)
class Outcome:
    model: str
    device: DeviceKind
    chosen: Trial
    reference: Trial  # torch fp32 at the fleet's shape: the vectors all are judged against
    fp32: Trial  # the same, timed in the rounds the chosen profile was last timed in
    runner_up: Trial | None  # the best of another runtime x precision
    ndcg_fp32: float | None
    trials: list[Trial] = field(default_factory=list)
    load: LoadSeen = field(default_factory=LoadSeen)  # other processes' load while timing
    threads_why: str | None = None  # why fewer threads than cores, when so


@dataclass(frozen=True, slots=True)
class Timing:
    seconds: float
    tokens: int  # real ones, padding excluded
    out: NDArray[np.float32]


class Search:
    def __init__(
        self,
        spec: EncoderSpec,
        device: DeviceKind,
        loader: Loader,
        workload: Workload,
        *,
        threads: int,
        cores: int,
        plan: Plan,
        labelled: LabelledSet | None = None,
        progress: Progress | None = None,
        quiet: Quieting | None = None,
    ) -> None:
        if spec.task != Task.EMBED:
            raise TuneError(f"model {spec.name!r} is a {spec.task}: only embedders are tuned")
        self.spec, self.device, self.loader, self.workload = spec, device, loader, workload
        self.threads, self.cores, self.plan = threads, cores, plan
        self.labelled = labelled
        self.progress = progress or NoProgress()
        self.quiet = quiet or Unwatched()
        self.trials: list[Trial] = []
        self.reference_out: NDArray[np.float32] | None = None
        self.ndcg_fp32: float | None = None
        self.ndcg_of: dict[tuple[str, str], float] = {}  # runtime x precision -> nDCG@10

    # -- running candidates ---------------------------------------------------

    def _load(self, candidate: Candidate) -> Runtime | str:
        profile = self.spec.profile(self.device).model_copy(update=candidate.fields())
        spec = self.spec.model_copy(
            update={"profiles": {**self.spec.profiles, self.device: profile}}
        )
        try:
            return self.loader(spec, self.device, candidate.threads)
        except Exception as exc:  # a candidate that cannot load is reported, not fatal
            return f"did not load: {type(exc).__name__}: {exc}"

    def _stage(
        self, name: str, candidates: Sequence[Candidate], *, reload: bool = False
    ) -> list[Trial]:
        """Time each candidate: warm-up, then ``repeats`` interleaved rounds, best kept,
        each round on a quiet device (``Quieting``). ``reload`` loads each candidate afresh
        before each of its timings (threads: torch's thread count is process-wide, set
        when a runtime loads), its warm-up within that timing."""
        trials = [Trial(name, c) for c in dict.fromkeys(candidates)]
        rounds = self.plan.repeats + (0 if reload else 1)
        self.progress.stage(name, len(trials) * rounds)
        log.info("tuning %s: %s, %d candidates x %d rounds", self.spec.name, name,
                 len(trials), self.plan.repeats)  # fmt: skip
        loaded: dict[tuple[object, ...], Runtime | str] = {}
        if not reload:
            self._round(trials, loaded, reload=False, counted=False)
        best: dict[int, Timing] = {}
        loads: list[float] = []
        for _ in range(self.plan.repeats):
            timings, load = self.quiet.round(
                lambda: self._round(trials, loaded, reload=reload, counted=True), self._waiting
            )
            loads += [load] if load is not None else []
            for i, timing in timings.items():
                if i not in best or timing.seconds < best[i].seconds:
                    best[i] = Timing(timing.seconds, timing.tokens, best.get(i, timing).out)
        for i, trial in enumerate(trials):
            trial.other_load_cores = max(loads, default=None)
            if trial.error is None and i in best:
                trial.tokens_per_s = best[i].tokens / best[i].seconds
                self._guard(trial, best[i].out)
        self.trials.extend(trials)
        return trials

    def _waiting(self, load: float) -> None:
        log.info("tuning %s: waiting for the CPU to quiet (other load %.1f cores)",
                 self.spec.name, load)  # fmt: skip

    def _round(
        self,
        trials: Sequence[Trial],
        loaded: dict[tuple[object, ...], Runtime | str],
        *,
        reload: bool,
        counted: bool,
    ) -> dict[int, Timing]:
        """One pass over every candidate still running, interleaved: their timings."""
        timings: dict[int, Timing] = {}
        for i, trial in enumerate(trials):
            if trial.error is None:
                key = trial.candidate.load_key
                runtime = self._load(trial.candidate) if reload else loaded.get(key)
                if runtime is None:
                    runtime = loaded[key] = self._load(trial.candidate)
                timing = self._time(trial, runtime, warm_up=reload or not counted)
                if timing is not None and counted:
                    timings[i] = timing
            self.progress.advance(trial.candidate.label)
        return timings

    def _time(self, trial: Trial, runtime: Runtime | str, *, warm_up: bool) -> Timing | None:
        if isinstance(runtime, str):
            trial.error = runtime
            return None
        try:
            encoded = self.workload.encode(runtime)
            parts = batches(encoded, trial.candidate.max_batch_tokens)
            if warm_up:
                timed_pass(runtime, parts)  # first calls pick kernels
            seconds, out = timed_pass(runtime, parts)
        except Exception as exc:
            trial.error = f"failed to run: {type(exc).__name__}: {exc}"
            return None
        self._retrieval(trial, runtime)
        return Timing(seconds, encoded.tokens, out)

    def _retrieval(self, trial: Trial, runtime: Runtime) -> None:
        """nDCG@10 once per runtime x precision that needs it (and for fp32, the bar)."""
        c = trial.candidate
        if self.labelled is None or (c.runtime, c.dtype) in self.ndcg_of:
            return
        bar_needed = any(needs_retrieval_check(d) for _, d in precisions(self.device))
        if needs_retrieval_check(c.dtype) or ((c.runtime, c.dtype) == REFERENCE and bar_needed):
            self.ndcg_of[(c.runtime, c.dtype)] = ndcg(runtime, self.spec, self.labelled)

    def _guard(self, trial: Trial, out: NDArray[np.float32]) -> None:
        c = trial.candidate
        if (c.runtime, c.dtype) == REFERENCE and self.reference_out is None:
            self.reference_out = out
        if self.reference_out is None:  # the reference failed: run() says so
            trial.error = "no torch fp32 reference to compare with"
            return
        try:
            cosine = worst_cosine(self.reference_out, out)
        except ValueError as exc:
            trial.error = f"wrong output: {exc}"
            return
        self.ndcg_fp32 = self.ndcg_of.get(REFERENCE)
        trial.verdict = judge(
            c.dtype, cosine, self.ndcg_of.get((c.runtime, c.dtype)), self.ndcg_fp32
        )

    # -- choosing -------------------------------------------------------------

    def _best(
        self, trials: Sequence[Trial], prefer: Callable[[Candidate], int] | None = None
    ) -> Trial:
        passed = sorted((t for t in trials if t.passed), key=lambda t: -(t.tokens_per_s or 0))
        if not passed:
            reasons = "; ".join(f"{t.candidate.label}: {t.refused}" for t in trials)
            raise TuneError(f"{self.spec.name}: no candidate passed: {reasons}")
        if prefer is None:
            return passed[0]
        fastest = passed[0].tokens_per_s or 0
        close = [t for t in passed if (t.tokens_per_s or 0) >= fastest * (1 - self.plan.tie)]
        return min(close, key=lambda t: prefer(t.candidate))

    def run(self) -> Outcome:
        fleet = Candidate.of(self.spec.profile(self.device), self.threads)
        options = precisions(self.device)
        if self.labelled is None and any(needs_retrieval_check(d) for _, d in options):
            # It could not pass the guard: timing it would only spend a tune's budget.
            log.info("tuning %s: int8 is not timed: it needs a retrieval check, and no "
                     "labelled set was given", self.spec.name)  # fmt: skip
            options = [(r, d) for r, d in options if not needs_retrieval_check(d)]
        if REFERENCE not in options:
            raise TuneError("the torch runtime's float32 is the reference and is not registered")
        # The reference first: every other candidate is judged against its outputs.
        first = [fleet.but(runtime=r, dtype=d) for r, d in [REFERENCE, *options]]
        stage1 = self._stage("runtime x precision", first)
        reference = next(t for t in stage1 if (t.candidate.runtime, t.candidate.dtype) == REFERENCE)
        if reference.error is not None:
            raise TuneError(f"the torch fp32 reference failed: {reference.error}")
        ranked = sorted((t for t in stage1 if t.passed), key=lambda t: -(t.tokens_per_s or 0))
        self._best(stage1)  # raises when nothing passed
        fp32 = reference
        shaped = []
        for t in ranked[: self.plan.finalists]:
            c = t.candidate
            shapes = [
                c.but(forward_tokens=ft, forward_max_sequences=fs) for ft, fs in self.plan.shapes
            ]
            stage = self._stage(f"pass shape, {c.runtime}/{c.dtype}", [c, *shapes])
            shaped.append(self._best(stage))
        budgets = [
            t.candidate.but(max_batch_tokens=m)
            for t in shaped
            for m in sorted({*self.plan.batch_tokens, t.candidate.max_batch_tokens})
            # A budget far below a pass only cuts passes short; the shape's own stays.
            if m >= t.candidate.forward_tokens // 2 or m == t.candidate.max_batch_tokens
        ]
        winner = self._best(self._stage("batch budget", budgets), lambda c: c.max_batch_tokens)
        chosen = winner
        if not self.plan.quick:
            counts = thread_counts(self.plan, self.cores)
            threads = [winner.candidate.but(threads=n) for n in counts]
            # fp32 again, in the same rounds: the speed-up recorded is against this timing,
            # not the first stage's (a shared machine's load drifts over minutes).
            last = self._stage("threads", [*threads, reference.candidate], reload=True)
            fp32 = next(t for t in last if t.candidate == reference.candidate)
            contenders = [t for t in last if t.candidate in threads]
            chosen = self._best(contenders, lambda c: c.threads)
        chosen_precision = (chosen.candidate.runtime, chosen.candidate.dtype)
        others = [t for t in ranked if (t.candidate.runtime, t.candidate.dtype) != chosen_precision]
        return Outcome(
            self.spec.name,
            self.device,
            chosen,
            reference,
            fp32,
            others[0] if others else None,
            self.ndcg_fp32,
            self.trials,
            self.quiet.seen,
            threads_why(chosen, self.trials, self.cores, self.plan.tie),
        )


def threads_why(chosen: Trial, trials: Sequence[Trial], cores: int, tie: float) -> str | None:
    """Why the chosen profile runs on fewer threads than the cores it may use, with the
    threads stage's figures; None when it uses them all or no threads stage ran."""
    c = chosen.candidate
    if chosen.stage != "threads" or c.threads >= cores or not chosen.tokens_per_s:
        return None
    same = [t for t in trials if t.stage == "threads" and t.passed and t.tokens_per_s
            and t.candidate == c.but(threads=t.candidate.threads)]  # fmt: skip
    # On equal figures the most threads count as the fastest: a tie is a tie, not a win.
    fastest = max(same, key=lambda t: (t.tokens_per_s or 0.0, t.candidate.threads))
    if fastest is chosen:
        others = "; ".join(f"{_threads(t)}: {t.tokens_per_s:,.0f}" for t in same if t is not chosen)
        others = others or "no other count passed"
        return f"{_threads(chosen)}: {chosen.tokens_per_s:,.0f} tok/s, the fastest ({others})"
    return (
        f"{_threads(chosen)}: {chosen.tokens_per_s:,.0f} tok/s within {tie:.0%} of "
        f"{_threads(fastest)}' {fastest.tokens_per_s:,.0f} (the tie rule prefers fewer)"
    )


def _threads(trial: Trial) -> str:
    n = trial.candidate.threads
    return f"{n} thread" if n == 1 else f"{n} threads"
