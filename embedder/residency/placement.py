"""Which on-demand models a worker holds when the queue is shared by many machines.

No service places models: each worker looks at the shared queue and at the others'
heartbeats, and takes a model the way it takes a request. A model with requests waiting
and no live host, or more waiting per host than ``BACKLOG_PER_HOST``, is loaded by a
worker with room for it (free memory, or idle models to evict); a resident model with
nothing in hand and nothing waiting for ``idle_evict_s`` is evicted. Against a herd
(every worker loading the same model at once) a worker waits a random moment first,
longer the fuller it is, so the emptiest tends to go first, then looks again: the first
to load says 'loading' in its heartbeat at once, and the others see a host.

``decide`` is the pure half (tested exhaustively); ``Placement`` is its loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from embedder.core.jobs import ModelState
from embedder.core.lifecycle import Lifecycle, cancel_and_wait, watch
from embedder.residency.keeper import Residents

log = logging.getLogger(__name__)

# A new backlog waits this long at most to be seen: short beside a model's load (seconds),
# and one consumer-info round trip per model each time costs the broker little.
INTERVAL_S = 0.5
# The longest random wait before a load (times 0.5 to 1.5 by how full this worker is):
# well above the milliseconds a heartbeat takes to reach the others, short beside a load.
JITTER_S = 0.5
# Requests unanswered per live host (waiting, or in a host's hand) past which one more
# worker loads the model.
BACKLOG_PER_HOST = 16
HOSTING: frozenset[str] = frozenset({"ready", "loading"})

Waiting = Callable[[Collection[str]], Awaitable[Mapping[str, int]]]  # unanswered, per model
Peers = Callable[[], Iterable[Mapping[str, Mapping[str, Any]]]]  # others' models, states


@dataclass(frozen=True, slots=True)
class ModelView:
    """One on-demand model as a worker sees it at one moment."""

    state: ModelState  # on this worker ('evicted' once a failed one may try again)
    waiting: int  # its requests in the shared queue not yet answered (in hand included)
    hosts: int  # other live workers that have it ready or loading
    idle_s: float  # since this worker last had work of it (inf: never)
    fits: bool  # room for it here now, in free memory or by evicting idle models


@dataclass(frozen=True, slots=True)
class Moves:
    load: str | None
    evict: tuple[str, ...]


def wanted(view: ModelView, per_host: int = BACKLOG_PER_HOST) -> bool:
    """Whether one more host is needed: work with no host, or more than ``per_host``
    waiting per host."""
    if view.waiting <= 0:
        return False
    return view.hosts == 0 or view.waiting > per_host * view.hosts


def decide(
    views: Mapping[str, ModelView], idle_evict_s: float, per_host: int = BACKLOG_PER_HOST
) -> Moves:
    """At most one model to load (a model with no host before one with too few, then the
    most waiting, then by name) and every idle model to evict. A model this worker holds
    is never loaded again; one it has no room for is left to a worker that has."""
    evict = tuple(
        sorted(
            name
            for name, v in views.items()
            if v.state == "ready" and v.waiting == 0 and v.idle_s >= idle_evict_s
        )
    )
    candidates = [
        (v.hosts > 0, -v.waiting, name)
        for name, v in views.items()
        if v.state == "evicted" and v.fits and wanted(v, per_host)
    ]
    return Moves(min(candidates)[2] if candidates else None, evict)


def hosts_of(model: str, peers: Iterable[Mapping[str, Mapping[str, Any]]]) -> int:
    return sum(1 for models in peers if models.get(model, {}).get("state") in HOSTING)


class Placement(Lifecycle):
    """A worker's loop over ``decide``, acting through its ``Residents``."""

    def __init__(
        self,
        residents: Residents,
        models: Collection[str],
        *,
        waiting: Waiting,
        peers: Peers,
        in_hand: Callable[[str], int],
        taken_at: Callable[[str], float | None] = lambda model: None,
        announce: Callable[[], Awaitable[None]],
        idle_evict_s: float,
        interval_s: float = INTERVAL_S,
        jitter_s: float = JITTER_S,
        rng: random.Random | None = None,
    ) -> None:
        """``models``: the on-demand models of this worker's fleet; ``waiting``: the
        queue's count of each one's requests not yet answered; ``peers``: the other live
        workers' models and states; ``taken_at``: when (on the residents' clock) this
        worker last took jobs of a model; ``announce``: put this worker's heartbeat now."""
        self.residents = residents
        self.models = sorted(models)
        self.waiting, self.peers, self.in_hand = waiting, peers, in_hand
        self.taken_at = taken_at
        self.announce = announce
        self.idle_evict_s, self.interval_s, self.jitter_s = idle_evict_s, interval_s, jitter_s
        self.rng = rng or random.Random()
        self._task: asyncio.Task[None] | None = None
        self._loading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None and self.models:
            self._task = watch(asyncio.create_task(self._run(), name="placement"))

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.step()
            except (OSError, TimeoutError) as exc:  # the broker's: the next look retries
                log.warning("placement: the queue could not be read: %r", exc)

    async def step(self) -> None:
        """One look at the queue and the peers, and what it calls for."""
        if self._loading is not None and self._loading.done():
            self._loading = None
            await self.announce()  # ready (or failed) now: the others know at once
        waiting = await self.waiting(self.models)
        now = self.residents.clock()
        self._note_use(waiting, now)
        moves = decide(self.views(waiting, now), self.idle_evict_s)
        for name in moves.evict:
            if self.in_hand(name) > 0:
                continue  # a job came since the look
            await self.residents.evict(name, f"idle for {self.idle_evict_s:.0f} s")
            await self.announce()
        if moves.load is not None and (self._loading is None or self._loading.done()):
            await self._load(moves.load, waiting)

    async def _load(self, name: str, waiting: Mapping[str, int]) -> None:
        await asyncio.sleep(self.rng.uniform(0, self.jitter_s) * (0.5 + self._fullness()))
        # Another worker may have taken it meanwhile: its heartbeat says so by now.
        view = self.views(waiting, self.residents.clock())[name]
        if view.state != "evicted" or not view.fits or not wanted(view):
            return
        log.info(
            "placement: loading %s: %d requests waiting, %d other hosts",
            name, view.waiting, view.hosts,
        )  # fmt: skip
        self._loading = self.residents.place(name)
        await self.announce()

    def views(self, waiting: Mapping[str, int], now: float) -> dict[str, ModelView]:
        peers = list(self.peers())
        views = {}
        for name in self.models:
            record = self.residents.records.get(name)
            if record is None:
                continue  # left the fleet
            state = record.state
            if state == "failed" and self.residents.retry_due(record, now):
                state = "evicted"
            last = record.last_used
            views[name] = ModelView(
                state=state,
                waiting=waiting.get(name, 0),
                hosts=hosts_of(name, peers),
                idle_s=math.inf if last is None else now - last,
                fits=self.residents.room_for(name),
            )
        return views

    def _note_use(self, waiting: Mapping[str, int], now: float) -> None:
        """A resident model with jobs in hand or waiting is in use now, and one was when
        its jobs were last taken (answered between two looks, they are in hand at
        neither): the clock its idle time and its place among the least recently used
        run from."""
        for name in self.models:
            record = self.residents.records.get(name)
            if record is None or record.state != "ready":
                continue
            if waiting.get(name, 0) > 0 or self.in_hand(name) > 0:
                record.last_used = now
            elif (taken := self.taken_at(name)) is not None:
                record.last_used = max(record.last_used or taken, taken)

    def _fullness(self) -> float:
        budget = self.residents.budget
        return min(self.residents.held() / budget, 1.0) if budget > 0 else 1.0
