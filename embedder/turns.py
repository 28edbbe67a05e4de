"""One device, several loops: the embedding pipeline's forwards and each generation
model's steps take turns on it.

Whoever asks while the device is free takes it. When several wait, the turn goes to the
loop served least recently, and among the turns of one loop to the most urgent (the
earliest deadline of the work behind it). A decode step is short and an embedding batch
is bounded by its token budget, so under a burst of either, the other waits at most one
turn: chat traffic cannot starve embeddings, nor the reverse. Pure asyncio: the work of
a turn runs in the caller's executor while it holds the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator


class DeviceTurns:
    def __init__(self) -> None:
        self._busy = False
        self._waiting: list[tuple[float, float, int, str, asyncio.Future[None]]] = []
        self._served: dict[str, float] = {}  # loop -> when it last got a turn (a counter)
        self._order = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(self, owner: str, deadline: float) -> AsyncIterator[None]:
        """Hold the device for the body of the ``async with``."""
        if self._busy:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (self._served.get(owner, -1.0), deadline, next(self._order), owner, future)
            heapq.heappush(self._waiting, entry)
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():
                    self._release()  # granted just as it was cancelled: pass it on
                raise
        self._busy = True
        self._served[owner] = float(next(self._order))
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            *_, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)  # the device stays busy: it passes to this waiter
                return
        self._busy = False

    def waiting(self) -> int:
        return sum(1 for *_, future in self._waiting if not future.done())
