"""The shape of every async loop: ``start``/``stop`` and ``async with``, and a watch on
background tasks so that none dies silently; ``Closable`` fits that shape to what is
open once made and only closed (a store, a client)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import Any, Self

log = logging.getLogger(__name__)


def watch(task: asyncio.Task[None]) -> asyncio.Task[None]:
    """Log a background task that dies of a bug: no loop stops silently."""

    def crashed(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s died", task.get_name(), exc_info=task.exception())

    task.add_done_callback(crashed)
    return task


def running(*tasks: asyncio.Task[None] | None) -> bool:
    """Every task started and none ended: a loop that died (of a bug, which ``watch``
    logged) is not running."""
    return bool(tasks) and all(task is not None and not task.done() for task in tasks)


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel every task, then wait until each has finished unwinding (its ``finally``
    blocks run before the caller goes on to close what they use)."""
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Lifecycle:
    """``async with`` over ``start``/``stop``."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


class Closable(Lifecycle):
    """A ``Lifecycle`` for what is open from the moment it is made (a store, a client):
    nothing to start, and ``stop`` is ``close``, which is idempotent: the first call
    runs ``_release``, later ones do nothing."""

    _closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        # Marked first, so a release that fails is not tried again by the next close.
        self._closed = True
        await self._release()

    async def _release(self) -> None:
        raise NotImplementedError
