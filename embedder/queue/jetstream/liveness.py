"""Which models the fleet serves right now, over a JetStream KV bucket: each worker keeps
its key (its id) fresh with its models' states every ``interval_s``; the bucket forgets
a key after ``MISSED_BEATS`` intervals. A gateway watches the bucket and calls a model
ready while some worker that wrote within those intervals serves it; with none, the
model is 'loading' and the gateway answers 503 with Retry-After at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.kv import KeyValue

from embedder.core.jobs import ModelStates
from embedder.core.lifecycle import Lifecycle, cancel_and_wait, watch
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.security import NatsSecurity
from embedder.queue.jetstream.streams import workers_bucket
from embedder.queue.jetstream.submitter import connect
from embedder.queue.remote_workers import RemoteWorkers

log = logging.getLogger(__name__)

MISSED_BEATS = 3  # a worker silent this many intervals is gone
INTERVAL_S = 1.0


def _key(worker_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in worker_id)


class WorkerLiveness(Lifecycle):
    """A worker's side: its entry at start, refreshed every ``interval_s``, deleted at
    stop so gateways stop counting on it at once."""

    def __init__(
        self,
        *,
        url: str,
        worker_id: str,
        models: Sequence[str],
        states: ModelStates,
        config: JetStreamConfig | None = None,
        interval_s: float = INTERVAL_S,
        security: NatsSecurity | None = None,
    ) -> None:
        self.url = url
        self.security = security
        self.worker_id = worker_id
        self.models = list(models)
        self.states = states
        self.config = config or JetStreamConfig()
        self.interval_s = interval_s
        self._nc: Client | None = None
        self._kv: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        self._nc = await connect(self.url, f"flotilla-liveness {self.worker_id}", self.security)
        js = self._nc.jetstream()
        self._kv = await workers_bucket(js, self.config, MISSED_BEATS * self.interval_s)
        await self._put()
        self._task = watch(asyncio.create_task(self._beat(), name="liveness"))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)
        assert self._kv is not None and self._nc is not None
        with contextlib.suppress(NatsError):
            await self._kv.delete(_key(self.worker_id))
        await self._nc.close()

    def beat(self) -> dict[str, Any]:
        return {
            "worker": self.worker_id,
            "interval_s": self.interval_s,
            "models": {
                name: {"state": self.states.state(name), **self.states.describe(name)}
                for name in self.models
            },
        }

    async def _put(self) -> None:
        assert self._kv is not None
        await self._kv.put(_key(self.worker_id), json.dumps(self.beat(), default=str).encode())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self._put()
            except NatsError:
                log.warning("liveness update failed", exc_info=True)


@dataclass(frozen=True, slots=True)
class _Seen:
    expires: float  # on this gateway's clock: no clock is shared across machines
    models: dict[str, dict[str, Any]]


class FleetLiveness(RemoteWorkers, Lifecycle):
    """The gateway's ``ModelStates`` when its workers pull from JetStream."""

    def __init__(
        self,
        *,
        url: str,
        config: JetStreamConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        security: NatsSecurity | None = None,
    ) -> None:
        self.url = url
        self.security = security
        self.config = config or JetStreamConfig()
        self.clock = clock
        self._workers: dict[str, _Seen] = {}
        self._nc: Client | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        self._nc = await connect(self.url, "flotilla-gateway-liveness", self.security)
        kv = await workers_bucket(self._nc.jetstream(), self.config, MISSED_BEATS * INTERVAL_S)
        watcher = await kv.watchall()
        # The bucket's current entries come first: the live workers are known at once.
        while True:
            entry = await watcher.updates(timeout=5.0)  # type: ignore[no-untyped-call]
            if entry is None:
                break
            self._note(entry)
        self._task = watch(asyncio.create_task(self._follow(watcher), name="liveness-watch"))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)
        assert self._nc is not None
        await self._nc.close()

    async def _follow(self, watcher: KeyValue.KeyWatcher) -> None:
        while True:
            try:
                entry = await watcher.updates(timeout=60.0)  # type: ignore[no-untyped-call]
            except TimeoutError:
                continue
            if entry is not None:
                self._note(entry)

    def _note(self, entry: KeyValue.Entry) -> None:
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            self._workers.pop(entry.key, None)
            return
        try:
            beat = json.loads(entry.value)
            expires = self.clock() + MISSED_BEATS * float(beat["interval_s"])
            models = {str(k): dict(v) for k, v in dict(beat["models"]).items()}
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable liveness entry %r: %s", entry.value[:200], exc)
            return
        self._workers[entry.key] = _Seen(expires, models)
