"""The device's turns between the embedding worker and generation engines: whoever asks
a free device gets it; when several wait, the loop served least recently goes first, so
a loop that asks without pause cannot starve another."""

from __future__ import annotations

import asyncio
import itertools

from embedder.turns import DeviceTurns


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
