"""One thread that owns a model's calls: the event loop hands it blocking work and awaits
the result. One thread, not a pool: a model and its tokenizer are not safe to call from
two threads at once, and one thread keeps the calls in the order they were made."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

_T = TypeVar("_T")


class OneThread:
    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"flotilla-{name}")

    async def call(self, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(*args)`` on this thread; the event loop goes on meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        """Stop taking calls; queued ones are cancelled, a running one finishes unseen."""
        self._executor.shutdown(wait=False, cancel_futures=True)
