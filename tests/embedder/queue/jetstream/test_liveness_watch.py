"""The gateway's watch on the liveness bucket ends when it is told to, even when a
worker's last word (its entry deleted as it stops) arrives in the same moment."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from nats.js.kv import KeyValue

from embedder.queue.jetstream.liveness import next_entry


def last_word() -> KeyValue.Entry:
    return KeyValue.Entry(
        bucket="workers", key="w1", value=b"", revision=7, delta=0, created=None,
        operation="DEL",
    )  # fmt: skip


async def test_a_cancel_as_an_entry_arrives_ends_the_watch() -> None:
    watcher = KeyValue.KeyWatcher(None)  # type: ignore[no-untyped-call]

    async def follow() -> None:  # the watch's loop: an entry, or silence, then again
        while True:
            with contextlib.suppress(TimeoutError):
                await next_entry(watcher, 3.0)

    following = asyncio.create_task(follow())
    await asyncio.sleep(0)  # it waits for the next entry
    watcher._updates.put_nowait(last_word())
    await asyncio.sleep(0)  # the entry is taken from the queue...
    following.cancel()  # ...as the stop comes, before the watch has seen it
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(1.0):  # not the next silence, 3 s away, nor later
            await following


async def test_an_entry_or_silence_comes_back() -> None:
    watcher = KeyValue.KeyWatcher(None)  # type: ignore[no-untyped-call]
    watcher._updates.put_nowait(last_word())
    assert (await next_entry(watcher, 1.0)).revision == 7  # type: ignore[union-attr]
    with pytest.raises(TimeoutError):
        await next_entry(watcher, 0.05)
