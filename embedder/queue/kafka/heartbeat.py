"""Which models the fleet serves right now: workers publish heartbeats, gateways read them.

Every worker sends, each ``interval_s``, one small JSON record to the status
topic: its id and, per model of the fleet, ``ready``/``loading``/``failed``
with the runtime's description. A gateway reads the topic (from shortly before
its end, so it knows the live workers at once) and calls a model ready while
some worker that beat within three intervals serves it. With no live worker a
model is "loading": the gateway answers 503 with Retry-After at once instead of
letting requests wait for their deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer, ConsumerRecord
from aiokafka.errors import KafkaError

from embedder.jobs import ModelStates
from embedder.lifecycle import Lifecycle, cancel_and_wait, watch
from embedder.queue.kafka import topics
from embedder.queue.kafka.reader import TopicReader
from embedder.queue.remote_workers import RemoteWorkers

log = logging.getLogger(__name__)

STATUS_RETENTION_MS = 600_000
HISTORY = 1_024  # beats read back at start: enough for every live worker's last one
MISSED_BEATS = 3  # a worker silent this many intervals is gone


def status_topic_spec() -> topics.TopicSpec:
    return topics.TopicSpec(
        1, {"retention.ms": str(STATUS_RETENTION_MS), "segment.ms": str(STATUS_RETENTION_MS)}
    )


class WorkerHeartbeat(Lifecycle):
    """A worker's side: a beat at start, one every ``interval_s``, a goodbye at stop."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        worker_id: str,
        models: Sequence[str],
        states: ModelStates,
        interval_s: float = 1.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.worker_id = worker_id
        self.models = list(models)
        self.states = states
        self.interval_s = interval_s
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        await topics.ensure_topics(self.bootstrap, {self.topic: status_topic_spec()})
        self._producer = topics.producer(self.bootstrap)  # beats are small: the default size
        await self._producer.start()
        await self._send(leaving=False)  # known at once, not an interval later
        self._task = watch(asyncio.create_task(self._beat(), name="heartbeat"))

    async def stop(self) -> None:
        """Says goodbye, so gateways stop counting on this worker at once."""
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)
        assert self._producer is not None
        with contextlib.suppress(KafkaError):
            await self._send(leaving=True)
        await self._producer.stop()

    def beat(self, *, leaving: bool) -> dict[str, Any]:
        models = {}
        if not leaving:
            models = {
                name: {"state": self.states.state(name), **self.states.describe(name)}
                for name in self.models
            }
        return {
            "worker": self.worker_id,
            "interval_s": self.interval_s,
            "leaving": leaving,
            "models": models,
        }

    async def _send(self, *, leaving: bool) -> None:
        assert self._producer is not None
        value = json.dumps(self.beat(leaving=leaving), default=str).encode()
        await self._producer.send_and_wait(self.topic, value=value, key=self.worker_id.encode())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self._send(leaving=False)
            except KafkaError:
                log.warning("heartbeat to %s failed", self.topic, exc_info=True)


@dataclass(frozen=True, slots=True)
class _Seen:
    at: float  # the beat's timestamp, wall-clock seconds
    expires: float
    models: dict[str, dict[str, Any]]


class FleetStatus(RemoteWorkers, Lifecycle):
    """The gateway's ``ModelStates`` when its workers are other processes."""

    def __init__(self, *, bootstrap: str, topic: str, clock: Callable[[], float] = time.time):
        self.bootstrap = bootstrap
        self.topic = topic
        self.clock = clock
        self._workers: dict[str, _Seen] = {}
        self._reader: TopicReader | None = None  # set once started

    async def start(self) -> None:
        if self._reader is not None:
            return
        await topics.ensure_topics(self.bootstrap, {self.topic: status_topic_spec()})
        # Starting shortly before the end: every live worker's last beat is in there, so
        # the gateway knows them at once instead of an interval later.
        reader = TopicReader(
            bootstrap=self.bootstrap,
            topic=self.topic,
            handle=self._note,
            what="heartbeats",
            history=HISTORY,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        await reader.start()
        self._reader = reader

    async def stop(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.stop()

    def _note(self, record: ConsumerRecord[bytes, bytes]) -> None:
        value, at = record.value, record.timestamp / 1e3  # the beat's time, in seconds
        try:
            beat = json.loads(value or b"")
            worker = str(beat["worker"])
            leaving = bool(beat["leaving"])
            expires = at + MISSED_BEATS * float(beat["interval_s"])
            models = {str(k): dict(v) for k, v in dict(beat["models"]).items()}
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable heartbeat %r: %s", value, exc)
            return
        if leaving:
            self._workers.pop(worker, None)
        elif worker not in self._workers or self._workers[worker].at <= at:
            self._workers[worker] = _Seen(at, expires, models)
