"""The worker's runner: host work of one batch beside another's forward, each job still
getting its own outcome, in order; and the pace that says when to prepare ahead."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from embedder.tasks.embed.batching import BatchLimits
from embedder.core.errors import FlotillaError, InferenceFailed, InvalidRequest
from embedder.tasks.embed.execute import Prepared
from embedder.core.jobs import Job, JobResult, TruncationSide
from embedder.tasks.embed.pipeline import Pace
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.runtimes import Encoded
from tests.embedder.tasks.embed.test_worker import WAIT_S, Client, expected, spec_of, vectors_of, worker_for
from tests.fakes import FAIL_MARKER, FakeRuntime

# -- the pace ----------------------------------------------------------------------------


def test_nothing_is_prepared_ahead_until_both_stages_are_timed() -> None:
    pace = Pace()
    assert pace.lead_s(100, 100) is None
    pace.timed_device(0.1, 100)
    assert pace.lead_s(100, 100) is None
    pace.timed_prepare(0.01, 100)
    assert pace.lead_s(100, 100) == pytest.approx(0.1 - Pace.SAFETY * 0.01)


def test_preparing_starts_at_once_when_the_host_is_the_slower_stage() -> None:
    pace = Pace()
    pace.timed_device(0.001, 100)
    pace.timed_prepare(0.01, 100)
    assert pace.lead_s(100, 100) == 0.0


def test_the_pace_is_smoothed_and_ignores_empty_batches() -> None:
    pace = Pace()
    pace.timed_device(1.0, 100)  # 10 ms per token
    pace.timed_device(2.0, 100)  # 20 ms per token
    assert pace.device_s_per_token == pytest.approx(0.01 + Pace.SMOOTHING * 0.01)
    pace.timed_device(5.0, 0)
    assert pace.device_s_per_token == pytest.approx(0.01 + Pace.SMOOTHING * 0.01)


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
