"""Waiting in the distributed tests: bounded, so a broken test fails instead of hanging."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import ParamSpec

P = ParamSpec("P")


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], what: str, timeout_s: float = 20.0
) -> None:
    """Poll ``check`` until it holds; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        ok = check()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


def bounded(
    seconds: float,
) -> Callable[[Callable[P, Awaitable[None]]], Callable[P, Awaitable[None]]]:
    """An async test that fails after ``seconds`` with a TimeoutError chained to the
    await it was stuck on: an idle event loop shows nothing in a thread dump."""

    def wrap(test: Callable[P, Awaitable[None]]) -> Callable[P, Awaitable[None]]:
        @functools.wraps(test)
        async def run(*args: P.args, **kwargs: P.kwargs) -> None:
            async with asyncio.timeout(seconds):
                await test(*args, **kwargs)

        return run

    return wrap
