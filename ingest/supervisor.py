"""Keeps an ingest source running: a run that fails is logged in one line with its
reason, counted, and started again after a capped, jittered backoff, so a broker
outage or a bug met once does not end ingestion while the process stays up and says
it is fine. Its state is the ``IngestHealth`` that ``/ready`` and ``/metrics`` show.

Errors listed as ``fatal`` (a missing topic for `flotilla ingest`: a configuration
error no retry fixes) end the supervisor instead, re-raised by ``wait``.

A store outage is no failure of the run: the core holds its chunk and retries it (up to
its backoff's deadline), and the state says ``waiting``, with the reason, until the store
answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter, Gauge

from embedder.core.errors import FlotillaError
from embedder.core.lifecycle import Lifecycle, cancel_and_wait
from ingest.health import IngestState, IngestStatus, StoreWatch

log = logging.getLogger(__name__)

UP = Gauge("flotilla_ingest_up", "1 while the ingest loop is consuming, else 0.", ["topic"])
RESTARTS = Counter(
    "flotilla_ingest_restarts", "Times the ingest loop failed and was restarted.", ["topic"]
)
STORE_UP = Gauge(
    "flotilla_ingest_store_up",
    "0 while ingest waits on an unavailable vector store (retrying its chunk), else 1.",
    ["topic"],
)


class Source(Protocol):
    """What is supervised (``KafkaSource``): restartable after ``wait`` raised."""

    topic: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def wait(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """Exponential backoff from ``first_s`` doubling up to ``max_s``, each delay drawn
    from its upper half (jitter: members of a group that failed together do not rejoin
    together); a run that lasted ``healthy_s`` starts the sequence over."""

    first_s: float = 1.0
    max_s: float = 60.0
    healthy_s: float = 60.0

    def delay(self, failures: int) -> float:
        ceiling = min(self.max_s, self.first_s * 2.0 ** min(failures, 32))
        return ceiling * (0.5 + random.random() / 2)


def describe(exc: BaseException) -> str:
    if isinstance(exc, FlotillaError):
        return exc.message
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class IngestSupervisor(Lifecycle):
    def __init__(
        self,
        source: Source,
        *,
        policy: RestartPolicy | None = None,
        fatal: tuple[type[BaseException], ...] = (),
        store: StoreWatch | None = None,
    ) -> None:
        """``store``: the watch of the core the source feeds (``IngestCore.store_watch``),
        so that a store outage shows as ``waiting`` while the source holds its chunk."""
        self.source = source
        self.policy = policy or RestartPolicy()
        self.fatal = fatal
        self._status = IngestStatus("starting", source.topic)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._source_running = False
        self._store = store
        UP.labels(source.topic).set(0)
        STORE_UP.labels(source.topic).set(1)
        if store is not None:
            store.listen(self._store_changed)

    def status(self) -> IngestStatus:
        return self._status

    def _set(self, state: IngestState, last_error: str | None = None) -> None:
        self._status = IngestStatus(state, self.source.topic, self._status.restarts, last_error)
        UP.labels(self.source.topic).set(1 if state == "running" else 0)

    def _consuming(self) -> None:
        """Running, or waiting if the store is unavailable."""
        reason = None if self._store is None else self._store.reason
        self._set("running" if reason is None else "waiting", reason)

    def _store_changed(self, reason: str | None) -> None:
        STORE_UP.labels(self.source.topic).set(1 if reason is None else 0)
        if self._status.state in ("running", "waiting"):
            self._consuming()

    async def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(), name=f"ingest-{self.source.topic}")

    async def stop(self) -> None:
        """Stop the source (the chunk in flight finishes and commits), or, while it is
        starting or backing off, cancel that."""
        if self._task is None:
            return
        self._stopping.set()
        task, self._task = self._task, None
        if self._source_running:
            await self.source.stop()  # its wait() returns, and so does _run
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        else:
            with contextlib.suppress(Exception):  # a fatal error: wait() has raised it
                await cancel_and_wait(task)
            with contextlib.suppress(Exception):
                await self.source.stop()
        if self._status.state != "failed":
            self._set("stopped", self._status.last_error)

    async def wait(self) -> None:
        """Until stopped; re-raises a fatal error."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                await self.source.start()
                self._source_running = True
                self._consuming()
                await self.source.wait()
                return  # stopped on request
            except self.fatal as exc:
                self._set("failed", describe(exc))  # the caller reports it: wait() raises it
                raise
            except Exception as exc:
                reason = describe(exc)
                log.debug("ingest from %s failed", self.source.topic, exc_info=exc)
            finally:
                self._source_running = False
            with contextlib.suppress(Exception):
                await self.source.stop()  # close what the failed run left open
            if time.monotonic() - started >= self.policy.healthy_s:
                failures = 0
            delay = self.policy.delay(failures)
            failures += 1
            self._status = IngestStatus(
                "restarting", self.source.topic, self._status.restarts + 1, reason
            )
            UP.labels(self.source.topic).set(0)
            RESTARTS.labels(self.source.topic).inc()
            log.error(
                "ingest from %s failed: %s; restarting in %.1f s (restart %d)",
                self.source.topic,
                reason,
                delay,
                self._status.restarts,
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()
