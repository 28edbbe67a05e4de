"""The device's turns between the embedding worker and generation engines: whoever asks
a free device gets it; when several wait, the loop served least recently goes first, so
a loop that asks without pause cannot starve another; a turn's work lends the device to
a waiter at the points it chooses."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time

from embedder.serving.turns import DeviceTurns


async def test_a_free_device_is_taken_at_once() -> None:
    turns = DeviceTurns()
    async with turns.turn("embed", 1.0):
        assert turns.waiting() == 0


async def test_two_busy_loops_alternate() -> None:
    turns = DeviceTurns()
    order: list[str] = []

    async def loop(owner: str, deadline: float) -> None:
        for _ in range(5):
            async with turns.turn(owner, deadline):
                order.append(owner)
                await asyncio.sleep(0.001)

    # generate's turns all carry an earlier deadline: still, embed is not starved
    await asyncio.gather(loop("generate", 0.0), loop("embed", 100.0))
    assert order[:2] == ["generate", "embed"]
    assert all(a != b for a, b in itertools.pairwise(order))


async def test_among_one_loops_waiters_the_earliest_deadline_first() -> None:
    turns = DeviceTurns()
    order: list[float] = []
    release = asyncio.Event()

    async def hold() -> None:
        async with turns.turn("a", 0.0):
            await release.wait()

    async def one(deadline: float) -> None:
        async with turns.turn("b", deadline):
            order.append(deadline)

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(one(d)) for d in (3.0, 1.0, 2.0)]
    await asyncio.sleep(0)
    assert turns.waiting() == 3
    release.set()
    await asyncio.gather(holder, *waiters)
    assert order == [1.0, 2.0, 3.0]


async def test_a_cancelled_waiter_passes_its_turn_on() -> None:
    turns = DeviceTurns()
    release = asyncio.Event()
    got: list[str] = []

    async def hold() -> None:
        async with turns.turn("a", 0.0):
            await release.wait()

    async def one(owner: str) -> None:
        async with turns.turn(owner, 0.0):
            got.append(owner)

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    gone, stays = asyncio.create_task(one("b")), asyncio.create_task(one("c"))
    await asyncio.sleep(0)
    gone.cancel()
    release.set()
    await asyncio.wait_for(asyncio.gather(holder, stays), 2)
    assert got == ["c"]
    async with turns.turn("d", 0.0):  # and the device is free again after
        pass


async def test_work_in_a_thread_lends_the_device_to_a_waiter_and_gets_it_back() -> None:
    """A turn's work running in a thread reaches a lend point while another loop waits:
    the waiter's turn runs then, inside the lender's, and the lender goes on after it."""
    turns = DeviceTurns()
    events: list[str] = []
    waiting = threading.Event()

    def long_work() -> None:  # a forward, its blocks calling lend_point
        for block in range(4):
            if block == 2:
                waiting.wait(5)
                time.sleep(0.01)  # the waiter is queued by now
            turns.lend_point("generate", 1.0)
            events.append(f"block {block}")

    async def lender() -> None:
        async with turns.turn("generate", 1.0):
            await asyncio.get_running_loop().run_in_executor(None, long_work)

    async def embed() -> None:
        await asyncio.sleep(0.01)
        waiting.set()
        async with turns.turn("embed", 5.0):
            events.append("embed")

    await asyncio.wait_for(asyncio.gather(lender(), embed()), 10)
    assert events == ["block 0", "block 1", "embed", "block 2", "block 3"]
    assert turns.waiting() == 0
    async with turns.turn("other", 1.0):  # the device is free again
        pass


def test_a_lend_point_with_nobody_waiting_returns_at_once() -> None:
    turns = DeviceTurns()
    started = time.perf_counter()
    for _ in range(1000):
        turns.lend_point("generate", 1.0)
    assert time.perf_counter() - started < 0.5


async def test_a_cancelled_waiter_is_not_counted_as_asking() -> None:
    turns = DeviceTurns()
    release = asyncio.Event()

    async def hold() -> None:
        async with turns.turn("a", 0.0):
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(turns.turn("b", 1.0).__aenter__())
    await asyncio.sleep(0)
    assert turns.waiting() == 1
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    assert turns.waiting() == 0  # a lender would not wait for it
    release.set()
    await holder
