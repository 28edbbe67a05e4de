"""Which models the fleet serves right now, over a JetStream KV bucket: each worker keeps
its key (its id) fresh with its models' states every ``interval_s``; the bucket forgets
a key after ``MISSED_BEATS`` intervals. A gateway watches the bucket and calls a model
ready while some worker that wrote within those intervals serves it; with none, the
model is 'loading' and the gateway answers 503 with Retry-After at once. A worker's entry
also lists the on-demand models it could load (``hosts``): a model one of them offers is
'evicted' (its requests queue, and a worker's placement loads it), not refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from embedder.core.jobs import ModelStates
from embedder.core.lifecycle import Lifecycle, cancel_and_wait, watch
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.connection import UNREACHABLE, Connection, Sparse, missing
from embedder.queue.jetstream.security import NatsSecurity
from embedder.queue.jetstream.streams import workers_bucket
from embedder.queue.remote_workers import RemoteWorkers, Sighting

log = logging.getLogger(__name__)

MISSED_BEATS = 3  # a worker silent this many intervals is gone
INTERVAL_S = 1.0
# A watcher that heard nothing this long checks that its bucket is still the server's:
# with workers beating it never does; with none it costs one request per period.
SILENCE_S = MISSED_BEATS * INTERVAL_S


def _key(worker_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in worker_id)


async def next_entry(watcher: KeyValue.KeyWatcher, timeout_s: float) -> KeyValue.Entry | None:
    """The watcher's next entry (None: the end of what the bucket held), TimeoutError after
    ``timeout_s``. Not the client's own timeout: it is ``asyncio.wait_for``, which on
    Python 3.11 drops a cancellation that comes as an entry arrives (a worker's last
    word as the gateway stops), and the watch would then run on."""
    async with asyncio.timeout(timeout_s):
        return await watcher.updates(timeout=None)  # type: ignore[no-untyped-call,no-any-return]


class WorkerLiveness(Lifecycle):
    """A worker's side: its entry at start, refreshed every ``interval_s``, deleted at
    stop so gateways stop counting on it at once. The bucket is made again when the
    server lost it (it is in memory: every restart), and the entry put at once then."""

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
        hosts: Callable[[], Collection[str]] = tuple,
    ) -> None:
        """``hosts``: the models this worker could load on demand (its heartbeat says so,
        so that a gateway queues their requests instead of refusing them)."""
        self.url = url
        self.worker_id = worker_id
        self.models = list(models)
        self.states = states
        self.hosts = hosts
        self.config = config or JetStreamConfig()
        self.interval_s = interval_s
        self._link = Connection(url, f"flotilla-liveness {worker_id}", self._establish, security)
        self._kv: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None
        self._failures = Sparse(log)

    async def start(self) -> None:
        if self._task is not None:
            return
        await self._link.open()
        self._task = watch(asyncio.create_task(self._beat(), name="liveness"))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)
        if self._kv is not None and self._link.connected:
            with contextlib.suppress(NatsError, TimeoutError):
                await self._kv.delete(_key(self.worker_id))
        await self._link.close()

    async def _establish(self) -> None:
        self._kv = await workers_bucket(self._link.js, self.config, MISSED_BEATS * self.interval_s)
        await self._put()

    def beat(self) -> dict[str, Any]:
        return {
            "worker": self.worker_id,
            "interval_s": self.interval_s,
            "models": {
                name: {"state": self.states.state(name), **self.states.describe(name)}
                for name in self.models
            },
            "hosts": sorted(self.hosts()),
            "deadline_lanes_ms": list(self.config.deadline_lanes_ms),
        }

    async def announce(self) -> None:
        """Put the entry now, not at the next beat: a load that just started tells the
        other workers before they start the same one."""
        if self._kv is None or not self._link.connected:
            return
        try:
            await self._put()
        except (NatsError, TimeoutError) as exc:
            self._failures.warning("liveness update failed: %r", exc)

    async def _put(self) -> None:
        assert self._kv is not None
        await self._kv.put(_key(self.worker_id), json.dumps(self.beat(), default=str).encode())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if not self._link.connected:
                continue  # the reconnect puts the entry again
            try:
                await self._put()
            except (NatsError, TimeoutError) as exc:
                if missing(exc):
                    self._link.renew()  # the bucket is gone: made again, then put
                self._failures.warning("liveness update failed: %r", exc)


@dataclass(frozen=True, slots=True)
class _Seen:
    expires: float  # on this gateway's clock: no clock is shared across machines
    models: dict[str, dict[str, Any]]
    hosts: frozenset[str] = frozenset()  # the models it could load on demand
    lanes_ms: tuple[int, ...] = ()  # the bounds of the deadline lanes it pulls


class FleetLiveness(RemoteWorkers, Lifecycle):
    """The gateway's ``ModelStates`` when its workers pull from JetStream.

    A watcher dies with the server's copy of the bucket (a restart, or the bucket
    deleted): after a reconnect, or when the bucket is silent for ``SILENCE_S`` and is not
    the one watched any more, a new watcher reads the bucket afresh. Meanwhile the workers
    seen are kept until their beats expire, as always; a model with no live worker then
    says why (``unheard``)."""

    def __init__(
        self,
        *,
        url: str,
        config: JetStreamConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        security: NatsSecurity | None = None,
    ) -> None:
        self.url = url
        self.config = config or JetStreamConfig()
        self.clock = clock
        self._workers: dict[str, _Seen] = {}
        self._link = Connection(url, "flotilla-gateway-liveness", self._watch, security)
        self._task: asyncio.Task[None] | None = None
        self._watcher: KeyValue.KeyWatcher | None = None
        self._heard_after = 0  # the connection's reconnects when a worker was last heard
        self._revision = 0  # the bucket's sequence of the latest word the watcher delivered

    async def start(self) -> None:
        await self._link.open()

    async def stop(self) -> None:
        if not self._link.opened:
            return
        await cancel_and_wait(self._task)
        await self._link.close()

    def cut_off(self) -> bool:
        return not self._link.connected

    @staticmethod
    def key_of(worker_id: str) -> str:
        return _key(worker_id)

    def unusable(self, seen: Sighting) -> str | None:
        """A worker reads its lanes' subjects and the model's own (its last lane): it takes
        this gateway's requests only if it pulls at least as many lanes. Other bounds on as
        many lanes only sort requests differently, so they are served."""
        ours = self.config.deadline_lanes_ms
        if len(seen.lanes_ms) >= len(ours):
            return None
        return (
            f"the live workers that serve it pull {len(seen.lanes_ms)} deadline lane(s) "
            f"{list(seen.lanes_ms)} ms, fewer than this gateway's {len(ours)} {list(ours)} ms: "
            "its urgent requests would wait where no worker reads; give gateways and "
            "workers the same --nats-deadline-lanes-ms (FLOTILLA_NATS_DEADLINE_LANES_MS)"
        )

    def unheard(self) -> str | None:
        if not self._link.connected:
            return f"{UNREACHABLE}: no worker can be heard from"
        if self._heard_after < self._link.reconnects:
            return "no worker has been heard from since the queue broker (NATS) came back"
        return None

    async def _watch(self) -> None:
        """A new watcher on the bucket (made when missing) in place of the last one; the
        bucket's current entries come first, so the live workers are known at once."""
        # Back (or trying again while the bucket cannot be had yet, a cluster without its
        # quorum): the workers last heard are reconnecting too, and get the grace from now.
        self._back_at = self.clock()
        kv = await workers_bucket(self._link.js, self.config, MISSED_BEATS * INTERVAL_S)
        info = (await kv.status()).stream_info
        created = info.created
        # What the bucket held up to now the watcher reads first; only later word counts.
        self._revision = info.state.last_seq
        watcher = await kv.watchall()
        try:
            while True:
                entry = await next_entry(watcher, 5.0)
                if entry is None:  # the end of what the bucket held
                    break
                self._note(entry)
        except BaseException:
            await watcher.stop()  # type: ignore[no-untyped-call]
            raise
        old, self._watcher = self._watcher, watcher
        await cancel_and_wait(self._task)
        if old is not None:
            with contextlib.suppress(NatsError):
                await old.stop()  # type: ignore[no-untyped-call]
        self._task = watch(
            asyncio.create_task(self._follow(kv, watcher, created), name="liveness-watch")
        )

    async def _follow(self, kv: KeyValue, watcher: KeyValue.KeyWatcher, created: object) -> None:
        while True:
            try:
                entry = await next_entry(watcher, SILENCE_S)
            except TimeoutError:
                if await self._watcher_lost(kv, created):
                    self._link.renew()
                    return
                continue
            if entry is not None:
                self._note(entry)

    async def _watcher_lost(self, kv: KeyValue, created: object) -> bool:
        """Whether the watcher stopped hearing its bucket: the bucket is gone (deleted, or
        lost by the server and made again), or it holds word the watcher never delivered.
        The latter is a watcher whose consumer died with a clustered server that led the
        bucket: the client makes it again only after missed heartbeats, and gives up when
        that one try fails (no leader yet), so the watcher would stay silent while the
        workers beat on. A server that does not answer now is the reconnect's business."""
        try:
            status = await kv.status()
        except NotFoundError:
            return True
        except (NatsError, TimeoutError):
            return False
        info = status.stream_info
        return info.created != created or info.state.last_seq > self._revision

    def _note(self, entry: KeyValue.Entry) -> None:
        self._last_word = self.clock()
        self._revision = max(self._revision, entry.revision or 0)
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            self._workers.pop(entry.key, None)
            return
        try:
            beat = json.loads(entry.value)
            expires = self.clock() + MISSED_BEATS * float(beat["interval_s"])
            models = {str(k): dict(v) for k, v in dict(beat["models"]).items()}
            hosts = frozenset(map(str, beat.get("hosts", ())))
            lanes = tuple(map(int, beat.get("deadline_lanes_ms", ())))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable liveness entry %r: %s", entry.value[:200], exc)
            return
        self._workers[entry.key] = _Seen(expires, models, hosts, lanes)
        self._heard_after = self._link.reconnects
