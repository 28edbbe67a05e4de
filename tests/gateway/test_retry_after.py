"""Retry-After on 429: the tokens in flight over the rate the model has drained them at
since it became busy, within 1..60 s; on a fake clock, so each figure is exact."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from embedder.core.errors import LimitExceeded, Overloaded
from flotilla.settings import Settings
from gateway.admission import MAX_RETRY_AFTER_S, Admission, retry_after_s
from tests.gateway.conftest import Loader, StackFactory


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def refused(admission: Admission, model: str, tokens: int) -> int:
    """The Retry-After a request of ``tokens`` gets now (it must be refused)."""
    with pytest.raises(Overloaded) as caught, admission.admit(model, tokens):
        pass
    assert caught.value.headers["Retry-After"] == str(caught.value.retry_after_s)
    return caught.value.retry_after_s


def test_retry_after_is_the_queue_over_the_rate_since_the_burst_began() -> None:
    clock = Clock()
    admission = Admission(120_000, clock=clock)
    with contextlib.ExitStack() as held:
        # A model idle for a long time, then a burst: 10 requests of 10,000 tokens.
        clock.now += 3600
        for _ in range(10):
            held.enter_context(admission.admit("m", 10_000))
        # In the first half second it serves two of them, and two more arrive.
        clock.now += 0.5
        for _ in range(2):
            with admission.admit("m", 10_000):
                pass  # admitted, served at once: counted at 20,000 tokens in 0.5 s
        assert admission.inflight["m"] == 100_000
        # 100,000 queued at 40,000 tokens/s: 2.5 s, rounded up. A fixed ten-second window
        # would have said 4,000 tokens/s and 25 s.
        assert refused(admission, "m", 30_000) == 3


def test_old_bursts_do_not_count_and_their_rate_stands_in_at_the_start() -> None:
    clock = Clock()
    admission = Admission(50_000, clock=clock)
    # A first busy period: 20,000 tokens over 2 s (10,000 tokens/s).
    with admission.admit("m", 20_000):
        clock.now += 2
    clock.now += 30  # idle
    with admission.admit("m", 50_000):
        # Just became busy: nothing measured yet, the last busy period's rate stands in.
        assert refused(admission, "m", 1) == 5
        # A second later the model has served nothing of the new burst: no rate of its
        # own yet either (a rate of 0 would say "never").
        clock.now += 1
        assert refused(admission, "m", 1) == 5


def test_bounds() -> None:
    assert retry_after_s(10, None) == 1  # nothing measured: come back soon
    assert retry_after_s(10, 1e9) == 1  # never 0
    assert retry_after_s(10**9, 1.0) == MAX_RETRY_AFTER_S  # never more than a minute
    assert retry_after_s(10_000, 1_000.0) == 10


def test_a_slow_model_is_told_to_wait_longer() -> None:
    clock = Clock()
    admission = Admission(40_000, clock=clock)
    with admission.admit("m", 30_000):
        with admission.admit("m", 10_000):  # 10,000 served over 4 s: 2,500 tokens/s
            clock.now += 4
        with admission.admit("m", 10_000):
            assert refused(admission, "m", 5_000) == 16  # 40,000 / 2,500


def test_failed_requests_free_their_budget_without_counting_as_served() -> None:
    clock = Clock()
    admission = Admission(1_000, clock=clock)
    with pytest.raises(RuntimeError), admission.admit("m", 1_000):
        clock.now += 1
        raise RuntimeError("the batch failed")
    assert admission.inflight["m"] == 0
    assert admission.drain.rate("m", clock.now) is None
    with pytest.raises(LimitExceeded, match="--max-inflight-tokens"), admission.admit("m", 1_001):
        pass


async def test_a_real_burst_is_told_to_come_back_within_its_drain_time(
    make_stack: StackFactory,
) -> None:
    # A slow model and a small budget: most of the burst is refused; the advice must fit
    # how long the admitted work really took to drain (the issue saw 75 s for 9).
    settings = Settings(max_inflight_tokens=120)
    async with make_stack(settings, loader=Loader(seconds_per_token=0.002)) as s:

        async def post(i: int) -> tuple[int, str | None]:
            body = {"model": "alpha", "input": f"request {i} " + "word " * 12}
            response = await s.client.post("/v1/embeddings", json=body)
            return response.status_code, response.headers.get("retry-after")

        start = time.monotonic()
        first = await asyncio.gather(*(post(i) for i in range(20)))
        drained_s = time.monotonic() - start
        second = await asyncio.gather(*(post(i) for i in range(20)))  # the meter has a rate
        advice = [int(ra) for status, ra in first + second if status == 429 and ra]
        assert advice and len(advice) == [st for st, _ in first + second].count(429)
        assert 1 <= max(advice) <= max(2, 3 * drained_s)
