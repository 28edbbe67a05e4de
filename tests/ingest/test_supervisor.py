"""The ingest supervisor: a failed run is restarted after a capped, jittered backoff,
counted and reported; a fatal error ends it; stop works in every state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from ingest.health import StoreWatch
from ingest.supervisor import STORE_UP, UP, IngestSupervisor, RestartPolicy

QUICK = RestartPolicy(first_s=0.01, max_s=0.05, healthy_s=60)


class ScriptedSource:
    """Fails its first runs as ``script`` says (an exception at start, or once running),
    then runs until stopped."""

    topic = "docs"

    def __init__(self, script: list[tuple[str, BaseException]]) -> None:
        self.script = list(script)
        self.starts = 0
        self.stops = 0
        self._run: asyncio.Future[None] | None = None

    async def start(self) -> None:
        self.starts += 1
        self._run = asyncio.get_running_loop().create_future()
        if self.script:
            when, exc = self.script.pop(0)
            if when == "start":
                raise exc
            self._run.set_exception(exc)

    async def wait(self) -> None:
        assert self._run is not None
        await self._run

    async def stop(self) -> None:
        self.stops += 1
        if self._run is not None and not self._run.done():
            self._run.set_result(None)


async def until(check: Callable[[], bool], timeout_s: float = 5) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"not within {timeout_s} s")


async def test_failures_are_restarted_counted_and_logged_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = ScriptedSource(
        [("start", ConnectionError("broker down")), ("run", RuntimeError("bug met once"))]
    )
    supervisor = IngestSupervisor(source, policy=QUICK)
    with caplog.at_level(logging.ERROR, logger="ingest.supervisor"):
        async with supervisor:
            await until(lambda: supervisor.status().state == "running" and source.starts == 3)
            status = supervisor.status()
            assert (status.restarts, status.up, status.last_error) == (2, True, None)
            assert UP.labels("docs")._value.get() == 1
    assert supervisor.status().state == "stopped"
    assert UP.labels("docs")._value.get() == 0
    failures = [r.getMessage() for r in caplog.records]
    assert len(failures) == 2
    assert "ConnectionError: broker down" in failures[0]
    assert "RuntimeError: bug met once" in failures[1] and "restart 2" in failures[1]


async def test_while_backing_off_the_status_says_why() -> None:
    source = ScriptedSource([("start", ConnectionError("no route"))])
    slow = RestartPolicy(first_s=30, max_s=30)
    async with IngestSupervisor(source, policy=slow) as supervisor:
        await until(lambda: supervisor.status().state == "restarting")
        status = supervisor.status()
        assert (status.up, status.restarts) == (False, 1)
        assert status.last_error == "ConnectionError: no route"
    # stop() during the 15-30 s backoff returns at once
    assert supervisor.status().state == "stopped"


async def test_a_store_outage_shows_as_waiting_until_the_store_answers() -> None:
    """The core's store watch: a run is not failed by an outage (the core retries its
    chunk), but says it waits, in the status and the gauges, and resumes by itself."""
    watch = StoreWatch()
    supervisor = IngestSupervisor(ScriptedSource([]), policy=QUICK, store=watch)
    async with supervisor:
        await until(lambda: supervisor.status().state == "running")
        watch.down("Qdrant unreachable: ConnectError: refused")
        status = supervisor.status()
        assert (status.state, status.up, status.restarts) == ("waiting", False, 0)
        assert status.last_error == "Qdrant unreachable: ConnectError: refused"
        assert (UP.labels("docs")._value.get(), STORE_UP.labels("docs")._value.get()) == (0, 0)
        watch.down("Qdrant unreachable: ReadTimeout")  # a retry that failed otherwise
        assert supervisor.status().last_error == "Qdrant unreachable: ReadTimeout"
        watch.up()
        status = supervisor.status()
        assert (status.state, status.up, status.last_error) == ("running", True, None)
        assert (UP.labels("docs")._value.get(), STORE_UP.labels("docs")._value.get()) == (1, 1)
        watch.down("down again")
    assert supervisor.status().state == "stopped"  # a stop while waiting is a stop
    assert STORE_UP.labels("docs")._value.get() == 0


async def test_a_run_that_starts_during_an_outage_is_waiting() -> None:
    watch = StoreWatch()
    watch.down("Qdrant unreachable")
    async with IngestSupervisor(ScriptedSource([]), policy=QUICK, store=watch) as supervisor:
        await until(lambda: supervisor.status().state != "starting")
        assert supervisor.status().state == "waiting"


async def test_a_fatal_error_ends_the_supervisor() -> None:
    class Missing(Exception):
        pass

    source = ScriptedSource([("start", Missing("topic 'x' does not exist"))])
    supervisor = IngestSupervisor(source, policy=QUICK, fatal=(Missing,))
    async with supervisor:
        with pytest.raises(Missing):
            await asyncio.wait_for(supervisor.wait(), 5)
        assert supervisor.status().state == "failed"
        assert supervisor.status().last_error == "Missing: topic 'x' does not exist"
    assert source.starts == 1


def test_backoff_doubles_to_its_cap_with_jitter() -> None:
    policy = RestartPolicy(first_s=1, max_s=60)
    for failures, ceiling in [(0, 1), (1, 2), (3, 8), (6, 60), (40, 60)]:
        delays = [policy.delay(failures) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (failures, delays)
        assert len(set(delays)) > 1
