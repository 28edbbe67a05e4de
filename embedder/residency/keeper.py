"""Which models are resident on this device, within its memory budget.

A model loads at start (``load: start``) or for the first request that names it
(``load: on_demand``: ``demand``); requests that come while it loads wait for the same
load in the queue. Loads and evictions run one at a time, so each measures the memory
it adds or frees alone. Before a load, the least recently used models that are not
pinned and have no job in hand or waiting are evicted until the model's expected size
fits; if the budget is held by models in use, the load waits for one to fall idle, up
to the last deadline of the requests that want it. A load that fails for memory evicts
every idle model and tries once more; a model still over the budget after loading is
unloaded and failed. A failed model answers 503 with the reason, and loads again on a
request after ``FAILED_RETRY_S``; one that failed at start stays failed.

The budget is kept on what the device holds, measured, not only on what the loads
measured: memory that evictions did not hand back (a runtime's caches, the allocator's
fragments) and a batch's working memory count against it too (``unaccounted``). What
the process held before any model (``outside``: the interpreter, the server, each
runtime's libraries as they are first imported) does not.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable

from embedder.core.errors import FlotillaError, NoRoom, NotReady
from embedder.core.fleet import DeviceKind
from embedder.core.jobs import ModelState
from embedder.residency.measures import Measure, Measures
from embedder.residency.memory import MB, MemoryMeter, budget_bytes, meter_for
from embedder.residency.records import Residency, evictable, held_bytes, victims
from embedder.serving import metrics

log = logging.getLogger(__name__)

FAILED_RETRY_S = 30.0  # a failed on-demand model loads again on a request after this
ROOM_POLL_S = 0.05  # how often a load waiting for memory looks for an idle model

Load = Callable[[str], Awaitable[None]]  # load and serve a model; raises if it cannot
# Import what a load needs; returns what it set up (a runtime's name), whose memory is
# measured the first time and kept outside the budget, or None if nothing.
Prepare = Callable[[str], Awaitable[str | None]]
Unload = Callable[[str], Awaitable[None]]  # stop serving a model and drop its runtime
Refuse = Callable[[str, FlotillaError], Awaitable[None]]  # answer its queued jobs with


class Residents:
    def __init__(
        self,
        budget_mb: float,
        load: Load,
        unload: Unload,
        busy: Callable[[str], bool],
        refuse: Refuse,
        *,
        prepare: Prepare | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.budget_mb = budget_mb
        self.budget = 0  # bytes; set by ``attach`` once the device is known
        self.meter: MemoryMeter | None = None
        self.measures = Measures(None)  # this device's measures of earlier processes
        self.records: dict[str, Residency] = {}
        self._load, self._unload, self._busy, self._refuse = load, unload, busy, refuse
        self._prepare = prepare
        self._prepared: set[str] = set()  # what ``prepare`` set up, its memory in ``outside``
        self.outside = 0  # bytes the device holds that no model accounts for, nor frees
        self.clock = clock
        self._lock = asyncio.Lock()  # one load or eviction at a time: each measured alone
        self._loads: dict[str, asyncio.Task[None]] = {}  # on-demand loads under way
        self._wanted_until: dict[str, float] = {}  # the last deadline waiting for a load

    def attach(
        self, device: DeviceKind, meter: MemoryMeter | None = None, measures: Measures | None = None
    ) -> None:
        self.meter = meter or meter_for(device)
        self.measures = measures or Measures(None)
        for record in self.records.values():
            self._recall(record)
        self.budget = budget_bytes(self.budget_mb, device)
        self.outside = self.meter.used()
        log.info("memory budget for the models on %s: %.0f MB", device, self.budget / MB)

    def track(
        self, name: str, *, pinned: bool, on_demand: bool, estimate: int | None, family: str = ""
    ) -> None:
        """Keep ``name``'s residency; ``family``: entries that cost alike (a measure of one
        is the others' estimate until they are measured themselves)."""
        state: ModelState = "evicted" if on_demand else "loading"
        measured = [r.memory_bytes for r in self.records.values() if family and r.family == family]
        known = next((m for m in measured if m is not None), None)
        record = self.records[name] = Residency(
            name, pinned, on_demand, state=state, estimate_bytes=known or estimate, family=family
        )
        if known is None:
            self._recall(record)

    def _recall(self, record: Residency) -> None:
        """An unmeasured model takes what its family measured here before (an earlier
        process on this device): its size, its load's peak and time."""
        before = self.measures.get(record.family)
        if before is None or record.memory_bytes is not None:
            return
        record.estimate_bytes = before.memory_bytes
        record.load_peak_bytes = record.load_peak_bytes or before.load_peak_bytes
        record.load_s = record.load_s or before.load_s

    def forget(self, name: str) -> None:
        self.records.pop(name, None)
        metrics.MODEL_MEMORY_BYTES.labels(name).set(0)

    def held(self) -> int:
        """What the models hold by their records, and what the device holds beyond it."""
        return held_bytes(self.records.values()) + self.unaccounted()

    def unaccounted(self) -> int:
        """Bytes the device holds beyond ``outside`` and the resident models' measures:
        memory evictions did not hand back, a batch's working memory. The budget counts
        it: evicting one more model is the only way to make up for it."""
        if self.meter is None:
            return 0
        resident = sum(r.memory_bytes or 0 for r in self.records.values() if r.state == "ready")
        return max(self.meter.used() - self.outside - resident, 0)

    # -- requests ---------------------------------------------------------------------

    def demand(self, name: str, deadline: float) -> None:
        """``LoadsOnDemand.demand`` for one model."""
        record = self.records.get(name)
        if record is None:
            return
        now = self.clock()
        record.last_used = now
        if record.state == "ready":
            return
        if record.state == "failed" and (
            record.failed_at is None or now - record.failed_at < FAILED_RETRY_S
        ):
            retry = 60 if record.failed_at is None else FAILED_RETRY_S - (now - record.failed_at)
            raise NotReady(
                f"model {name!r} failed to load: {record.error}", retry_after_s=math.ceil(retry)
            )
        if record.state == "loading" and name not in self._loads:
            raise NotReady(f"model {name!r} is still loading; retry shortly")
        self._wanted_until[name] = max(self._wanted_until.get(name, 0.0), deadline)
        if name not in self._loads:
            self._loads[name] = asyncio.create_task(self._on_demand(record), name=f"load-{name}")
        wait = self._expected_wait(record, now)
        if wait is not None and now + wait > deadline:
            raise NotReady(
                f"model {name!r} is loading: it took {record.load_s:.1f} s last time, more than "
                "this request's deadline leaves; retry after Retry-After, or send a longer "
                "x-request-timeout-ms",
                retry_after_s=max(1, math.ceil(wait)),
            )

    def _expected_wait(self, record: Residency, now: float) -> float | None:
        """Seconds until ``record`` is resident by the last measured load times: its own,
        and those of the loads ahead of it (they run one at a time, in the order they were
        asked for): what is left of the one under way, the whole of those still waiting.
        None when its own was never measured."""
        if record.load_s is None:
            return None
        if record.state == "loading" and record.loading_since is not None:
            return max(record.load_s - (now - record.loading_since), 0.0)
        under_way = sum(
            max((r.load_s or 0.0) - (now - r.loading_since), 0.0)
            for r in self.records.values()
            if r.state == "loading" and r.loading_since is not None
        )
        waiting = 0.0
        for name in self._loads:  # in the order asked for, as the lock lets them in
            if name == record.name:
                break
            other = self.records.get(name)
            if other is not None and other.state != "loading":
                waiting += other.load_s or 0.0
        return record.load_s + under_way + waiting

    async def _on_demand(self, record: Residency) -> None:
        try:
            await self.load(record.name, waits=True)
        finally:
            self._loads.pop(record.name, None)
            self._wanted_until.pop(record.name, None)

    # -- loading --------------------------------------------------------------------

    def place(self, name: str) -> asyncio.Task[None]:
        """Load ``name`` for work waiting in a queue shared with other machines: it says
        'loading' at once (so its heartbeat tells the others before they load it too), it
        takes room from idle models or else past the budget, and a failure is kept in its
        record without answering the queue's jobs (another machine may host it)."""
        task = self._loads.get(name)
        if task is not None:
            return task
        record = self.records[name]
        if record.state != "ready":
            record.state, record.loading_since = "loading", self.clock()
        record.last_used = self.clock()
        task = self._loads[name] = asyncio.create_task(self._placed(name), name=f"place-{name}")
        return task

    async def _placed(self, name: str) -> None:
        try:
            await self.load(name, refuses=False)
        finally:
            self._loads.pop(name, None)

    def room_for(self, name: str) -> bool:
        """Whether ``name`` fits now, in free memory or by evicting idle models."""
        record = self.records[name]
        need = record.loading_bytes if record.state not in ("ready", "loading") else 0
        need += self.unaccounted()
        chosen = victims(self.records.values(), need, self.budget, self._busy, loading=name)
        return chosen is not None

    def hostable(self) -> list[str]:
        """The on-demand models this device could hold beside its pinned ones, less those
        that failed here lately (they say so themselves until ``FAILED_RETRY_S``)."""
        now = self.clock()
        return sorted(
            r.name
            for r in self.records.values()
            if r.on_demand
            and r.loading_bytes <= self.budget - self._pinned_bytes(r.name)
            and not (r.state == "failed" and not self.retry_due(r, now))
        )

    @staticmethod
    def retry_due(record: Residency, now: float) -> bool:
        """A failed model may load again: it was loaded on demand, long enough ago."""
        return record.failed_at is not None and now - record.failed_at >= FAILED_RETRY_S

    async def load(self, name: str, *, waits: bool = False, refuses: bool = True) -> None:
        """Make ``name`` resident; failures are kept in its record (and, ``refuses``, its
        queued jobs answered with them), never raised. ``waits``: for memory held by
        models in use, up to the last deadline of the requests waiting when the load
        starts (later ones do not stretch a wait that holds every other load back); else
        loaded regardless."""
        record = self.records[name]
        async with self._lock:
            if record.state == "ready" or self.records.get(name) is not record:
                return
            record.state, record.error = "loading", None
            record.loading_since = record.loading_since or self.clock()
            until = self._wanted_until.get(name, 0.0) if waits else None
            try:
                await self._make_room(record, until)
                await self._load_retrying(record)
                await self._fit(record, until)
            except NoRoom as exc:
                record.state, record.error = "evicted", exc.message
                metrics.MODEL_LOADS.labels(name, "no_room").inc()
                log.warning("%s: not loaded: %s", name, exc.message)
                if refuses:
                    await self._refuse(name, exc)
            except Exception as exc:
                self._failed(record, exc)
                error = NotReady(f"model {name!r} failed to load: {record.error}", retry_after_s=30)
                if refuses:
                    await self._refuse(name, error)
            finally:
                record.loading_since = None

    def _failed(self, record: Residency, exc: BaseException) -> None:
        log.error("model %s failed to load", record.name, exc_info=exc)
        record.state, record.error = "failed", f"{type(exc).__name__}: {exc}"
        # A model that fails at start stays failed (as a fleet file's mistake would);
        # one loaded on demand may have met a passing shortage, and tries again later.
        record.failed_at = self.clock() if record.on_demand or record.loads else None
        metrics.MODEL_LOADS.labels(record.name, "failed").inc()

    async def _make_room(self, record: Residency, until: float | None) -> None:
        """Evict idle models until ``record`` fits; if models in use hold the room, wait
        for them up to ``until`` (None: load past the budget instead)."""
        while True:
            chosen = self._victims(record)
            if chosen == []:
                return
            for name in chosen or ():
                await self._evict(name, f"to make room for {record.name}")
            if chosen:
                continue
            if until is None:
                log.warning(
                    "%s: loading past the memory budget (%.0f of %.0f MB held): the models "
                    "resident are pinned or in use",
                    record.name, self.held() / MB, self.budget / MB,
                )  # fmt: skip
                return
            await self._could_fit(record)
            if self.clock() >= until - (record.load_s or 0.0):
                raise NoRoom(
                    f"the memory budget ({self.budget / MB:.0f} MB, --memory-budget-mb) is "
                    f"held by models in use or pinned; {record.name!r} "
                    f"({record.expected_bytes / MB:.0f} MB) could not load in time: retry, "
                    "or raise the budget",
                    retry_after_s=5,
                )
            await asyncio.sleep(ROOM_POLL_S)

    async def _could_fit(self, record: Residency) -> None:
        """Raise unless ``record`` would fit once the models in use fall idle: MemoryError
        if it is larger than the budget beside the pinned models (it never fits), NoRoom
        if memory held outside every model's measure leaves too little even once what is
        freed has been handed back (waiting for a model to fall idle would not help)."""
        room = self.budget - self._pinned_bytes(record.name)
        size = record.loading_bytes if record.state == "loading" else record.expected_bytes
        if size > room:
            raise MemoryError(
                f"{record.name!r} needs {size / MB:.0f} MB; the budget "
                f"({self.budget / MB:.0f} MB, --memory-budget-mb) leaves {room / MB:.0f} MB "
                "beside the pinned models"
            )
        outside = self.unaccounted()
        if size > room - outside:
            assert self.meter is not None
            # The last batch of a model just evicted may have let go of it only now.
            await asyncio.to_thread(self.meter.release)
            outside = self.unaccounted()
        if size > room - outside:
            raise NoRoom(
                f"{record.name!r} needs {size / MB:.0f} MB; of the budget "
                f"({self.budget / MB:.0f} MB, --memory-budget-mb) {outside / MB:.0f} MB are "
                "held beyond the models' own measures (memory evictions did not hand back, "
                f"batches' working memory) and {(self.budget - room) / MB:.0f} MB by pinned "
                "models: retry, or raise the budget",
                retry_after_s=5,
            )

    async def _load_retrying(self, record: Residency) -> None:
        """Load once; on running out of memory, evict every idle model and try again."""
        try:
            await self._load_measured(record)
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            log.warning(
                "%s: out of memory while loading; evicting idle models, retrying", record.name
            )
            for idle in evictable(self.records.values(), self._busy, loading=record.name):
                await self._evict(idle.name, f"after {record.name} ran out of memory")
            await self._load_measured(record)

    async def _load_measured(self, record: Residency) -> None:
        assert self.meter is not None, "attach() the device first"
        await self._prepare_measured(record.name)
        # Freed memory the allocator still holds would be reused by the load and hide it.
        await asyncio.to_thread(self.meter.settle)
        before = self.meter.used()
        self.meter.reset_peak()
        started = time.perf_counter()
        await self._load(record.name)
        record.load_s = time.perf_counter() - started
        record.memory_bytes = max(self.meter.used() - before, 0)
        record.load_peak_bytes = max(self.meter.peak() - before, 0)
        record.state, record.loads = "ready", record.loads + 1
        for sibling in self.records.values():
            if record.family and sibling.family == record.family and sibling.memory_bytes is None:
                sibling.estimate_bytes = record.memory_bytes
                sibling.load_peak_bytes = record.load_peak_bytes
        metrics.MODEL_LOADS.labels(record.name, "loaded").inc()
        metrics.MODEL_LOAD_SECONDS.labels(record.name).inc(record.load_s)
        metrics.MODEL_MEMORY_BYTES.labels(record.name).set(record.memory_bytes)
        log.info(
            "%s: resident in %.1f s, %.0f MB (%.0f of %.0f MB held)",
            record.name, record.load_s, record.memory_bytes / MB, self.held() / MB,
            self.budget / MB,
        )  # fmt: skip
        measure = Measure(record.memory_bytes, record.load_peak_bytes, record.load_s)
        await asyncio.to_thread(self.measures.put, record.family, measure)

    async def _prepare_measured(self, name: str) -> None:
        """Run ``prepare`` for ``name``; what it sets up the first time (a runtime's
        libraries, imported once per process) joins ``outside``: no eviction frees it."""
        if self._prepare is None:
            return
        assert self.meter is not None
        before = self.meter.used()
        what = await self._prepare(name)
        if what is None or what in self._prepared:
            return
        self._prepared.add(what)
        await asyncio.to_thread(self.meter.settle)
        grew = max(self.meter.used() - before, 0)
        self.outside += grew
        log.info("%s: set up for %s, %.0f MB outside the budget", what, name, grew / MB)

    async def _fit(self, record: Residency, until: float | None) -> None:
        """Past the budget now that its real size is known: evict others, waiting (as a
        load does) for busy ones to fall idle up to ``until``; unload it if it cannot fit."""
        while True:
            chosen = self._victims(record)
            for name in chosen or ():
                await self._evict(name, f"to make room for {record.name}")
            if chosen is not None or record.pinned or not record.on_demand:
                return
            try:
                await self._could_fit(record)
                if until is None or self.clock() >= until:
                    raise NoRoom(
                        f"the memory budget ({self.budget / MB:.0f} MB, --memory-budget-mb) "
                        f"is held by models in use; {record.name!r} "
                        f"({record.expected_bytes / MB:.0f} MB) could not stay: retry, or "
                        "raise the budget",
                        retry_after_s=5,
                    )
            except (MemoryError, NoRoom):
                await self._evict(record.name, "it does not fit the budget")
                raise
            await asyncio.sleep(ROOM_POLL_S)

    def _victims(self, record: Residency) -> list[str] | None:
        """``records.victims`` for ``record``'s load, with the memory no record explains."""
        extra = self.unaccounted()
        metrics.MEMORY_UNACCOUNTED_BYTES.set(extra)
        return victims(self.records.values(), extra, self.budget, self._busy, loading=record.name)

    def _pinned_bytes(self, exclude: str) -> int:
        """What the pinned models hold: memory no eviction can free."""
        return held_bytes(r for r in self.records.values() if r.name != exclude and r.pinned)

    async def _evict(self, name: str, why: str) -> None:
        """Unload ``name`` and hand its memory back; a request that comes meanwhile finds
        it evicted and loads it again."""
        assert self.meter is not None
        record = self.records[name]
        record.state = "evicted"
        before = self.meter.used()
        await self._unload(name)
        await asyncio.to_thread(self.meter.release)
        record.evictions += 1
        record.freed_bytes = before - self.meter.used()
        metrics.MODEL_EVICTIONS.labels(name).inc()
        metrics.MODEL_MEMORY_BYTES.labels(name).set(0)
        log.info(
            "%s: evicted %s (last used %s); %.0f MB freed",
            name, why, _ago(record.last_used, self.clock()), record.freed_bytes / MB,
        )  # fmt: skip

    async def evict(self, name: str, why: str) -> None:
        """Unload a resident model now (the admin API's removal), under the load lock."""
        async with self._lock:
            if self.records[name].state == "ready":
                await self._evict(name, why)

    async def stop(self) -> None:
        loads = list(self._loads.values())
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)

    def loading(self, names: Iterable[str]) -> list[asyncio.Task[None]]:
        return [task for name in names if (task := self._loads.get(name)) is not None]


def out_of_memory(exc: BaseException) -> bool:
    """A load that ran out of memory: the host's (MemoryError) or the card's (torch's
    OutOfMemoryError, a RuntimeError whose message says so)."""
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()


def _ago(when: float | None, now: float) -> str:
    return "never" if when is None else f"{now - when:.1f} s ago"
