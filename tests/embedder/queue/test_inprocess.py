"""InProcessQueue: what a puller gets, in what order, and how results reach the requester."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from embedder.core.errors import InvalidRequest
from embedder.core.jobs import ApiShape, Job, JobResult, Timings
from embedder.queue import Partial
from embedder.queue.inprocess import InProcessQueue

# Long enough that no test waits it out by accident, short enough to fail fast if one does.
WAIT_S = 2.0


def job(
    id: str,
    *,
    model: str = "alpha",
    tokens: int = 10,
    deadline_in_s: float = 30.0,
    priority: int = 0,
) -> Job:
    now = time.time()
    return Job(
        id=id,
        model=model,
        shape=ApiShape.TEI_EMBED,
        body=b'{"inputs": "x"}',
        est_tokens=tokens,
        deadline=now + deadline_in_s,
        enqueued_at=now,
        priority=priority,
    )


def result(text: str = "ok") -> JobResult:
    return JobResult(body=text.encode(), prompt_tokens=3, timings=Timings(0.0, 0.0))


def ids(jobs: list[Job]) -> list[str]:
    return [j.id for j in jobs]


async def test_pull_stops_at_the_token_budget() -> None:
    queue = InProcessQueue()
    for i in range(3):
        await queue.put(job(f"j{i}", tokens=10, deadline_in_s=10 + i))
    assert ids(await queue.pull(["alpha"], max_tokens=25, timeout_s=0)) == ["j0", "j1"]
    assert ids(await queue.pull(["alpha"], max_tokens=25, timeout_s=0)) == ["j2"]


async def test_pull_returns_one_job_even_when_it_is_over_the_budget() -> None:
    # Otherwise a job bigger than every worker's room would wait forever.
    queue = InProcessQueue()
    await queue.put(job("big", tokens=1_000))
    await queue.put(job("next", tokens=1))
    assert ids(await queue.pull(["alpha"], max_tokens=5, timeout_s=0)) == ["big"]


async def test_pull_takes_only_the_models_asked_for() -> None:
    queue = InProcessQueue()
    await queue.put(job("a", model="alpha", deadline_in_s=1))
    await queue.put(job("b", model="beta", deadline_in_s=2))
    assert ids(await queue.pull(["beta"], max_tokens=1_000, timeout_s=0)) == ["b"]
    assert ids(await queue.pull(["beta", "gamma"], max_tokens=1_000, timeout_s=0.01)) == []
    assert ids(await queue.pull(["alpha"], max_tokens=1_000, timeout_s=0)) == ["a"]


async def test_pull_goes_earliest_deadline_first_across_models() -> None:
    queue = InProcessQueue()
    await queue.put(job("a-late", model="alpha", deadline_in_s=30))
    await queue.put(job("b-soon", model="beta", deadline_in_s=10))
    await queue.put(job("a-soon", model="alpha", deadline_in_s=15))
    await queue.put(job("c-mid", model="gamma", deadline_in_s=20))
    pulled = await queue.pull(["alpha", "beta", "gamma"], max_tokens=1_000, timeout_s=0)
    assert ids(pulled) == ["b-soon", "a-soon", "c-mid", "a-late"]


async def test_priority_orders_jobs_with_the_same_deadline() -> None:
    queue = InProcessQueue()
    low = job("low", priority=1)
    high = dataclasses.replace(job("high", priority=0), deadline=low.deadline)
    await queue.put(low)
    await queue.put(high)
    assert ids(await queue.pull(["alpha"], max_tokens=1_000, timeout_s=0)) == ["high", "low"]


async def test_pull_waits_up_to_its_timeout_and_returns_nothing_when_empty() -> None:
    queue = InProcessQueue()
    start = time.perf_counter()
    assert await queue.pull(["alpha"], max_tokens=100, timeout_s=0.05) == []
    assert time.perf_counter() - start >= 0.04


async def test_a_put_wakes_a_waiting_puller() -> None:
    queue = InProcessQueue()
    puller = asyncio.create_task(queue.pull(["alpha"], max_tokens=100, timeout_s=WAIT_S))
    await asyncio.sleep(0.01)
    assert not puller.done()
    start = time.perf_counter()
    await queue.put(job("j"))
    assert ids(await puller) == ["j"]
    assert time.perf_counter() - start < WAIT_S / 2


async def test_a_puller_cancelled_as_a_job_arrives_is_cancelled_and_leaves_the_job() -> None:
    # A worker stops by cancelling its pull; a cancel that lands in the same turn as the
    # wake-up must still end the pull (asyncio.wait_for on Python 3.11 would lose it and
    # hand the job to a worker that is going away).
    queue = InProcessQueue()
    cancelled = 0
    for step in range(4):  # land the cancel at each step of the wake-up in turn
        puller = asyncio.create_task(queue.pull(["alpha"], max_tokens=100, timeout_s=WAIT_S))
        await asyncio.sleep(0)
        await queue.put(job(f"j{step}"))
        for _ in range(step):
            await asyncio.sleep(0)
        if puller.done():  # the pull finished first: the job is the puller's
            assert ids(await puller) == [f"j{step}"]
            continue
        puller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await puller
        assert ids(await queue.pull(["alpha"], max_tokens=100, timeout_s=0)) == [f"j{step}"]
        cancelled += 1
    assert cancelled  # at least one cancel did land mid-wake-up: the test tests something


async def test_a_put_for_another_model_does_not_satisfy_a_puller() -> None:
    queue = InProcessQueue()
    puller = asyncio.create_task(queue.pull(["alpha"], max_tokens=100, timeout_s=0.05))
    await asyncio.sleep(0.01)
    await queue.put(job("b", model="beta"))
    assert await puller == []
    assert queue.depth()["beta"] == 1


async def test_cancelling_the_future_withdraws_the_job() -> None:
    queue = InProcessQueue()
    gone = await queue.put(job("gone", deadline_in_s=1))
    await queue.put(job("kept", deadline_in_s=2))
    gone.cancel()
    await asyncio.sleep(0)  # done-callbacks run on the next loop turn
    assert queue.cancelled(["gone", "kept"]) == {"gone"}
    assert queue.depth()["alpha"] == 1
    assert ids(await queue.pull(["alpha"], max_tokens=1_000, timeout_s=0)) == ["kept"]


async def test_a_withdrawn_job_does_not_wake_a_puller() -> None:
    queue = InProcessQueue()
    future = await queue.put(job("gone"))
    future.cancel()
    await asyncio.sleep(0)
    assert await queue.pull(["alpha"], max_tokens=100, timeout_s=0.02) == []


async def test_a_job_handed_back_is_pulled_again_in_its_place_one_delivery_later() -> None:
    queue = InProcessQueue()
    for i in range(3):
        await queue.put(job(f"j{i}", deadline_in_s=10 + i))
    taken = await queue.pull(["alpha"], max_tokens=20, timeout_s=0)
    assert ids(taken) == ["j0", "j1"] and [j.deliveries for j in taken] == [1, 1]
    await queue.hand_back(taken)
    again = await queue.pull(["alpha"], max_tokens=1_000, timeout_s=0)
    assert ids(again) == ["j0", "j1", "j2"]  # its deadline did not move: neither did its place
    assert [j.deliveries for j in again] == [2, 2, 1]
    await queue.hand_back(again[:1])
    assert [j.deliveries for j in await queue.pull(["alpha"], 100, 0)] == [3]


async def test_a_job_handed_back_wakes_a_waiting_puller() -> None:
    queue = InProcessQueue()
    await queue.put(job("j"))
    taken = await queue.pull(["alpha"], max_tokens=100, timeout_s=0)
    waiting = asyncio.create_task(queue.pull(["alpha"], max_tokens=100, timeout_s=WAIT_S))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await queue.hand_back(taken)
    assert ids(await asyncio.wait_for(waiting, WAIT_S)) == ["j"]


async def test_a_job_withdrawn_or_answered_before_its_hand_back_is_dropped() -> None:
    queue = InProcessQueue()
    gone = await queue.put(job("gone"))
    await queue.put(job("done"))
    await queue.put(job("kept"))
    taken = await queue.pull(["alpha"], max_tokens=100, timeout_s=0)
    gone.cancel()
    await asyncio.sleep(0)
    await queue.complete("done", result())
    await queue.hand_back(taken)
    assert ids(await queue.pull(["alpha"], max_tokens=100, timeout_s=0)) == ["kept"]
    assert queue.depth()["alpha"] == 0


async def test_complete_delivers_the_result() -> None:
    queue = InProcessQueue()
    future = await queue.put(job("j"))
    await queue.pull(["alpha"], max_tokens=100, timeout_s=0)
    await queue.complete("j", result("done"))
    assert (await asyncio.wait_for(future, WAIT_S)).body == b"done"


async def test_complete_delivers_an_error_as_the_futures_exception() -> None:
    queue = InProcessQueue()
    future = await queue.put(job("j"))
    await queue.complete("j", InvalidRequest("bad input"))
    with pytest.raises(InvalidRequest, match="bad input"):
        await asyncio.wait_for(future, WAIT_S)


async def test_completing_a_cancelled_unknown_or_finished_job_is_harmless() -> None:
    queue = InProcessQueue()
    future = await queue.put(job("j"))
    future.cancel()
    await asyncio.sleep(0)
    await queue.complete("j", result())
    await queue.complete("never-queued", InvalidRequest("nobody waits"))
    done = await queue.put(job("k"))
    await queue.complete("k", result("first"))
    await queue.complete("k", result("second"))
    assert done.result().body == b"first"


async def test_depth_counts_waiting_jobs_per_model() -> None:
    queue = InProcessQueue()
    for i in range(3):
        await queue.put(job(f"a{i}", model="alpha"))
    withdrawn = await queue.put(job("b0", model="beta"))
    await queue.put(job("b1", model="beta"))
    assert queue.depth() == {"alpha": 3, "beta": 2}
    withdrawn.cancel()
    await asyncio.sleep(0)
    await queue.pull(["alpha"], max_tokens=10, timeout_s=0)
    assert queue.depth() == {"alpha": 2, "beta": 1}


async def test_a_duplicate_id_is_rejected_and_the_first_job_kept() -> None:
    queue = InProcessQueue()
    original = await queue.put(job("same"))
    with pytest.raises(ValueError, match="same"):
        await queue.put(job("same", model="beta"))
    assert queue.depth() == {"alpha": 1}
    await queue.complete("same", result("original"))
    assert original.result().body == b"original"


async def test_a_streamed_job_gets_its_partials_in_order_then_its_outcome() -> None:
    queue = InProcessQueue()
    stream = await queue.put_streaming(job("s"))
    [pulled] = await queue.pull(["alpha"], 100, WAIT_S)
    assert await queue.partial(pulled.id, Partial(0, b"a"))
    assert await queue.partial(pulled.id, Partial(1, b"b"))
    await queue.complete(pulled.id, result("end"))
    got = [await asyncio.wait_for(stream.next(), WAIT_S) for _ in range(3)]
    assert got[:2] == [Partial(0, b"a"), Partial(1, b"b")]
    assert isinstance(got[2], JobResult) and got[2].body == b"end"


async def test_a_streamed_error_is_raised_after_the_partials() -> None:
    queue = InProcessQueue()
    stream = await queue.put_streaming(job("s"))
    assert await queue.partial("s", Partial(0, b"a"))
    await queue.complete("s", InvalidRequest("bad"))
    assert await stream.next() == Partial(0, b"a")
    with pytest.raises(InvalidRequest, match="bad"):
        await stream.next()


async def test_partials_for_a_withdrawn_job_say_nobody_listens() -> None:
    queue = InProcessQueue()
    stream = await queue.put_streaming(job("s"))
    stream.cancel()
    await asyncio.sleep(0)
    assert not await queue.partial("s", Partial(0, b"a"))
    assert queue.cancelled(["s"]) == {"s"}


async def test_parts_of_a_job_taken_whole_are_joined_before_its_outcome() -> None:
    """A requester that put the job plainly (a relay from the shared queue) gets the
    parts a worker streamed, in front of the outcome's body."""
    queue = InProcessQueue()
    future = await queue.put(job("w"))
    assert await queue.partial("w", Partial(0, b"a"))
    assert await queue.partial("w", Partial(1, b"b"))
    await queue.complete("w", result("c"))
    assert (await asyncio.wait_for(future, WAIT_S)).body == b"abc"
