"""How long-running commands stop: SIGINT/SIGTERM set an event that the command
awaits, so it can finish the work in hand and commit before it exits. SIGUSR1 logs where
each task and thread waits, for a process that seems stuck (``kill -USR1 PID``)."""

from __future__ import annotations

import asyncio
import io
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
DUMP_SIGNAL = signal.SIGUSR1


def exit_cleanly_until_running() -> None:
    """Before a command holds any work (imports, start-up), SIGTERM has nothing to
    drain: leave with status 0 instead of dying by the signal. A supervisor that
    stops a process still starting then sees a clean exit."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def stop_event() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM, for the running loop; SIGUSR1 then dumps."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(DUMP_SIGNAL, dump_stacks)
    return stop


def dump_stacks() -> None:
    """Log where every task of the running loop waits and every thread's stack: what a
    process that does not stop, or does not answer, is waiting for. Not ``faulthandler``,
    which reads other threads' states unlocked: a thread ending meanwhile can crash it."""
    tasks = asyncio.all_tasks()
    text = io.StringIO()
    for task in sorted(tasks, key=lambda t: t.get_name()):
        task.print_stack(limit=12, file=text)
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        text.write(f"Thread {names.get(ident, ident)} (most recent call last):\n")
        text.writelines(traceback.format_stack(frame, limit=12))
    log.warning("%d tasks, on %s:\n%s", len(tasks), DUMP_SIGNAL.name, text.getvalue())


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
