"""A long-running command's signals: SIGUSR1 logs where each task waits and leaves the
command running; SIGTERM sets its stop."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from flotilla.signals import stop_event


async def test_sigusr1_logs_where_each_task_waits_and_stops_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = stop_event()

    async def waiting_for_a_reply() -> None:
        await asyncio.Event().wait()

    stuck = asyncio.create_task(waiting_for_a_reply(), name="stuck-reply")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="flotilla.signals"):
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(100):
            if caplog.records:
                break
            await asyncio.sleep(0.01)
    (record,) = caplog.records
    assert "tasks, on SIGUSR1" in record.message
    assert "stuck-reply" in record.message and "waiting_for_a_reply" in record.message
    assert not stop.is_set() and not stuck.done()
    os.kill(os.getpid(), signal.SIGTERM)
    async with asyncio.timeout(5):
        await stop.wait()
    stuck.cancel()
