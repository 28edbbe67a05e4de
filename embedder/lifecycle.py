"""The shape of every async loop: ``start``/``stop`` and ``async with``, and a watch on
background tasks so that none dies silently."""

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
