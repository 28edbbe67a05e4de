"""How long-running commands stop: SIGINT/SIGTERM set an event that the command
awaits, so it can finish the work in hand and commit before it exits."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_cleanly_until_running() -> None:
    """Before a command holds any work (imports, start-up), SIGTERM has nothing to
    drain: leave with status 0 instead of dying by the signal. A supervisor that
    stops a process still starting then sees a clean exit."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def stop_event() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM, for the running loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    return stop


async def stopped_first(working: asyncio.Future[Any], stop: asyncio.Event) -> bool:
    """Wait for ``working`` or ``stop``, whichever comes first; True if it was ``stop``."""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({working, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    return not working.done()


async def unless_stopped(work: Awaitable[None], stop: asyncio.Event) -> bool:
    """Await ``work`` unless ``stop`` comes first, which cancels it; True if it finished."""
    working = asyncio.ensure_future(work)
    if await stopped_first(working, stop):
        working.cancel()
        return False
    working.result()  # re-raise what stopped it
    return True
