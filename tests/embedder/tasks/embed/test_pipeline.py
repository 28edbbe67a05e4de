"""The worker's runner: host work of one batch beside another's forward, each job still
getting its own outcome, in order; and the pace: each model's batch cost learned from
its batches, and when to prepare ahead."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from embedder.core.errors import FlotillaError, InferenceFailed, InvalidRequest
from embedder.core.jobs import Job, JobResult, TruncationSide
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.batching import BatchLimits
from embedder.tasks.embed.execute import Prepared
from embedder.tasks.embed.pipeline import DeviceFit, Pace
from embedder.tasks.embed.runtimes import Encoded
from tests.embedder.tasks.embed.test_worker import (
    WAIT_S,
    Client,
    expected,
    spec_of,
    vectors_of,
    worker_for,
)
from tests.fakes import FAIL_MARKER, FakeRuntime

# -- the pace ----------------------------------------------------------------------------


def warmed(pace: Pace, model: str) -> Pace:
    """The model's first pass, a warm-up the fit leaves out, already run."""
    pace.timed_device(model, 10.0, 100)
    return pace


def test_the_first_pass_of_a_model_is_a_warm_up_and_teaches_nothing() -> None:
    pace = Pace()
    pace.timed_device("m", 10.0, 100)
    assert pace.batch_s("m", 100) is None
    pace.timed_device("m", 0.1, 100)
    assert pace.batch_s("m", 100) == pytest.approx(0.1)


def test_nothing_is_prepared_ahead_until_both_stages_are_timed() -> None:
    pace = warmed(Pace(), "m")
    assert pace.lead_s("m", 100, 100) is None
    pace.timed_device("m", 0.1, 100)
    assert pace.lead_s("m", 100, 100) is None
    pace.timed_prepare(0.01, 100)
    assert pace.lead_s("m", 100, 100) == pytest.approx(0.1 - Pace.SAFETY * 0.01)
    assert pace.lead_s("other", 100, 100) is None  # each model is timed on its own


def test_preparing_starts_at_once_when_the_host_is_the_slower_stage() -> None:
    pace = warmed(Pace(), "m")
    pace.timed_device("m", 0.001, 100)
    pace.timed_prepare(0.01, 100)
    assert pace.lead_s("m", 100, 100) == 0.0


def test_the_preparing_pace_is_smoothed_and_ignores_empty_batches() -> None:
    pace = Pace()
    pace.timed_prepare(1.0, 100)  # 10 ms per token
    pace.timed_prepare(2.0, 100)  # 20 ms per token
    assert pace.prepare_s_per_token == pytest.approx(0.01 + Pace.SMOOTHING * 0.01)
    pace.timed_prepare(5.0, 0)
    assert pace.prepare_s_per_token == pytest.approx(0.01 + Pace.SMOOTHING * 0.01)


FIXED, PER_TOKEN = 0.004, 2e-5  # a pass's fixed cost and each token's, in seconds


def fit_after_warm_up() -> DeviceFit:
    fit = DeviceFit()
    fit.add(10.0, 100)
    return fit


def timed(fit: DeviceFit, *sizes: int, fixed: float = FIXED, per_token: float = PER_TOKEN) -> None:
    for tokens in sizes:
        fit.add(fixed + per_token * tokens, tokens)


def test_the_fit_finds_the_fixed_and_the_per_token_cost_from_varied_batches() -> None:
    fit = fit_after_warm_up()
    assert fit.cost is None
    timed(fit, 100, 900, 300, 2000, 50)
    assert fit.cost is not None
    assert fit.cost.fixed_s == pytest.approx(FIXED)
    assert fit.cost.per_token_s == pytest.approx(PER_TOKEN)


def test_batches_of_one_size_give_the_line_through_the_origin() -> None:
    # The fixed and the per-token cost cannot be told apart yet: all of it per token,
    # exact at the size seen, an overestimate for larger batches (so a budget from it
    # takes no more than it has seen finish in time, scaled).
    fit = fit_after_warm_up()
    timed(fit, 100, 100, 104, 98)
    assert fit.cost is not None
    assert fit.cost.fixed_s == 0.0
    assert fit.cost.seconds(100) == pytest.approx(FIXED + PER_TOKEN * 100, rel=0.01)
    assert fit.cost.seconds(1000) > FIXED + PER_TOKEN * 1000
    timed(fit, 400, 1600)  # then sizes that differ teach it the fixed cost
    assert fit.cost.fixed_s > 0.0


@pytest.mark.parametrize(
    ("samples", "fixed", "per_token"),
    [
        ([(0.010, 100), (0.009, 200), (0.010, 100), (0.009, 200)], 0.0095, 0.0),  # tilts down
        ([(0.001, 100), (0.004, 200), (0.001, 100), (0.004, 200)], 0.0, 1.8e-5),  # below 0
    ],
    ids=["negative-per-token", "negative-fixed"],
)
def test_a_fit_tilted_by_noise_keeps_both_costs_non_negative(
    samples: list[tuple[float, int]], fixed: float, per_token: float
) -> None:
    fit = fit_after_warm_up()
    for seconds, tokens in samples:
        fit.add(seconds, tokens)
    assert fit.cost is not None
    assert fit.cost.fixed_s == pytest.approx(fixed, rel=0.05, abs=1e-9)
    assert fit.cost.per_token_s == pytest.approx(per_token, rel=0.05, abs=1e-12)


def test_the_fit_follows_a_device_that_slows_down() -> None:
    fit = fit_after_warm_up()
    sizes = [100, 900, 300, 2000, 50] * 4
    timed(fit, *sizes)
    timed(fit, *sizes * 3, fixed=3 * FIXED, per_token=3 * PER_TOKEN)  # now 3x slower
    assert fit.cost is not None
    assert fit.cost.seconds(1000) == pytest.approx(3 * (FIXED + PER_TOKEN * 1000), rel=0.05)


def test_empty_batches_teach_the_fit_nothing() -> None:
    fit = fit_after_warm_up()
    fit.add(1.0, 0)
    assert fit.cost is None
    cold = DeviceFit()
    cold.add(1.0, 0)  # not even the warm-up
    cold.add(10.0, 100)
    assert cold.cost is None


def test_the_pace_keeps_one_fit_per_model() -> None:
    pace = warmed(warmed(Pace(), "fast"), "slow")
    assert pace.batch_s("fast", 100) is None
    pace.timed_device("fast", 0.001, 100)
    pace.timed_device("slow", 0.003, 100)
    assert pace.batch_s("fast", 200) == pytest.approx(0.002)
    assert pace.batch_s("slow", 200) == pytest.approx(0.006)
    slow = pace.cost("slow")
    assert slow is not None and slow.fixed_s == 0.0
    assert slow.per_token_s == pytest.approx(3e-5)


def test_withdrawn_jobs_leave_a_prepared_batch() -> None:
    def job(i: str) -> Job:
        return Job(i, "m", "tei_embed", b"{}", 1, 1e18, 0.0)  # type: ignore[arg-type]

    encoded = Encoded([[101, 102]], None, [2])
    prepared = Prepared(
        [(job("a"), None, encoded), (job("b"), None, encoded)],  # type: ignore[list-item]
        [(job("c"), InvalidRequest("bad"))],
    )
    left = prepared.without({"b", "c"})
    assert [j.id for j, _, _ in left.items] == ["a"] and left.failed == []
    assert left.tokens == 2
    assert prepared.without(set()) is prepared


# -- overlap, outcomes and order -------------------------------------------------------


class OverlapRuntime(FakeRuntime):
    """A fake whose tokenizing and forward both take time, and which notes whether each
    tokenize call began while a forward was running."""

    TOKENIZE_S = 0.005

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.forwarding = threading.Event()
        self.tokenized_during_forward = 0

    def tokenize(self, texts: Sequence[str], side: TruncationSide, prefix: str = "") -> Encoded:
        self.tokenized_during_forward += self.forwarding.is_set()
        time.sleep(self.TOKENIZE_S)
        return super().tokenize(texts, side, prefix)

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> np.ndarray[Any, Any]:
        self.forwarding.set()
        try:
            return super().forward(encoded, adapters)
        finally:
            self.forwarding.clear()


async def test_host_work_overlaps_the_forward_and_every_job_keeps_its_own_outcome() -> None:
    # A forward of three tokens takes 30 ms and tokenizing 5 ms: once both are timed,
    # the next batch is prepared during the forward.
    runtime = OverlapRuntime(spec_of("alpha"), seconds_per_token=0.01)
    queue = InProcessQueue()
    client = Client(queue)
    one_at_a_time = BatchLimits(max_tokens=512, max_requests=1, max_wait_s=0.0)
    finished: list[str] = []
    sent: list[tuple[Job, asyncio.Future[JobResult]]] = []
    for i in range(16):
        if i == 5:
            payload: dict[str, object] | bytes = b'{"inputs": ["unterminated'
        elif i == 9:
            payload = {"inputs": [f"job {i} {FAIL_MARKER}"]}
        else:
            payload = {"inputs": [f"job {i}"]}
        job, future = await client.send("alpha", payload)
        future.add_done_callback(lambda _, job_id=job.id: finished.append(job_id))
        sent.append((job, future))
    async with worker_for(queue, [runtime], one_at_a_time):
        outcomes: list[JobResult | FlotillaError] = []
        for _, future in sent:
            try:
                outcomes.append(await asyncio.wait_for(future, 4 * WAIT_S))
            except FlotillaError as exc:
                outcomes.append(exc)

    assert runtime.tokenized_during_forward > 0
    for i, ((job, _), outcome) in enumerate(zip(sent, outcomes, strict=True)):
        if i == 5:
            assert isinstance(outcome, InvalidRequest), outcome
        elif i == 9:
            assert isinstance(outcome, InferenceFailed), outcome
        else:
            assert isinstance(outcome, JobResult), (job.id, outcome)
            np.testing.assert_allclose(
                vectors_of(outcome), expected(runtime, [f"job {i}"]), atol=1e-6
            )
    assert finished == [job.id for job, _ in sent]  # delivered in the order they were formed
    assert len(runtime.forward_calls) == 15  # all but the job with bad JSON
