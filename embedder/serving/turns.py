"""One device, several loops: the embedding pipeline's forwards and each generation
model's steps take turns on it.

Whoever asks while the device is free takes it. When several wait, the turn goes to the
loop served least recently, and among the turns of one loop to the most urgent (the
earliest deadline of the work behind it). A decode step is short and an embedding batch
is bounded by its token budget, so under a burst of either, the other waits at most one
turn: chat traffic cannot starve embeddings, nor the reverse. The work of a turn runs in
the caller's executor while it holds the turn.

A turn is not preempted, but its work may *lend* the device at points it chooses
(``lend_point``, called from the work's thread: a generation model calls it before each
decoder layer). If another loop waits, the device goes to it and the lender's thread
blocks until the device comes back, so an embedding batch waits for one layer of a
decode step, not for the whole step: on a CPU a decode step can take longer than an
embedding request alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
from collections.abc import AsyncIterator

# A lender whose device never comes back (the loop stopped) goes on after this long.
LEND_TIMEOUT_S = 30.0


class DeviceTurns:
    def __init__(self) -> None:
        self._busy = False
        self._waiting: list[tuple[float, float, int, str, asyncio.Future[None]]] = []
        self._served: dict[str, float] = {}  # loop -> when it last got a turn (a counter)
        self._order = itertools.count()
        self._asking = 0  # waiters not yet granted; read from other threads
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.asynccontextmanager
    async def turn(self, owner: str, deadline: float) -> AsyncIterator[None]:
        """Hold the device for the body of the ``async with``."""
        self._loop = asyncio.get_running_loop()
        if self._busy:
            future: asyncio.Future[None] = self._loop.create_future()
            entry = (self._served.get(owner, -1.0), deadline, next(self._order), owner, future)
            heapq.heappush(self._waiting, entry)
            self._asking += 1
            try:
                await future
            except asyncio.CancelledError:
                if future.cancelled():
                    self._asking -= 1
                elif future.done():
                    self._release()  # granted just as it was cancelled: pass it on
                raise
        self._busy = True
        self._served[owner] = float(next(self._order))
        try:
            yield
        finally:
            self._release()

    def lend_point(self, owner: str, deadline: float) -> None:
        """From the thread doing ``owner``'s turn: if another loop waits, let it run now
        and return when the device is back. Costs an attribute read when nobody waits."""
        loop = self._loop
        if self._asking == 0 or loop is None or not loop.is_running():
            return  # nobody waits, or no loop is left to hand the device back
        back = threading.Event()
        try:
            loop.call_soon_threadsafe(self._lend, owner, deadline, back)
        except RuntimeError:  # the loop closed meanwhile
            return
        back.wait(LEND_TIMEOUT_S)

    def _lend(self, owner: str, deadline: float, back: threading.Event) -> None:
        if self._asking == 0:  # granted elsewhere since the lender looked
            back.set()
            return
        assert self._loop is not None
        future: asyncio.Future[None] = self._loop.create_future()
        future.add_done_callback(lambda _: back.set())
        # Behind everyone waiting now: they go first, then the lender's turn goes on.
        self._served[owner] = float(next(self._order))
        entry = (self._served[owner], deadline, next(self._order), owner, future)
        heapq.heappush(self._waiting, entry)
        self._asking += 1
        self._release()

    def _release(self) -> None:
        while self._waiting:
            *_, future = heapq.heappop(self._waiting)
            if not future.done():
                self._asking -= 1
                future.set_result(None)  # the device stays busy: it passes to this waiter
                return
        self._busy = False

    def waiting(self) -> int:
        return self._asking
