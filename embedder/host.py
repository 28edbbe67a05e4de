"""Loads the fleet onto this machine's device and serves each model on its kind's engine.

Models load in a thread after start-up so the HTTP side answers probes (and 503s) at
once; each model is served as soon as it is loaded, so a fleet's first model does not
wait for a large one behind it. The host knows task kinds only through the registry
(``embedder.tasks.registry``): each model's kind loads it and names the engine it runs
in, one engine per name on this device, all taking turns on the one device
(``embedder.serving.turns``).

A model whose fleet entry leaves its profile to tuning (``dtype: auto``) is served with,
in this order: the tuned profile for this device's fingerprint (the shipped file or
``--tuned-file``); the one a tune on this machine kept (``embedder.tuning.cache``); one
borrowed from the same CPU with another core count; else the fleet's. With
``untuned='background'`` a model on the fleet's or a borrowed profile is tuned after all
models are loaded, one at a time, in a child process (``embedder.tuning.background``),
and moved to the result between two batches (``Switching``) if it differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from embedder.core.adapters import AdapterCatalog
from embedder.core.device import detect_device, fingerprint, usable_cores
from embedder.core.errors import FlotillaError
from embedder.core.fleet import DeviceKind, Fleet, LiveFleet, ModelSpec
from embedder.core.jobs import ModelState
from embedder.core.lifecycle import Lifecycle
from embedder.queue import JobPuller
from embedder.residency.keeper import Residents
from embedder.residency.measures import Measures
from embedder.residency.memory import MemoryMeter, weights_bytes
from embedder.serving.turns import DeviceTurns
from embedder.tasks.kind import Engine, EngineContext, Loader, Switching, TaskKind, Unloading
from embedder.tasks.registry import kind_of
from embedder.tuned import (
    TUNED_FIELDS,
    ProfileChoice,
    ProfileSource,
    TunedEntry,
    TunedProfiles,
    profile_for,
    tunable,
)
from embedder.tuning.background import Tuner, in_low_priority_thread, tune_in_child
from embedder.tuning.cache import identity_of, lookup, read_cache, record

log = logging.getLogger(__name__)
Untuned = Literal["defaults", "quick", "background"]
DRAIN_POLL_S = 0.05  # how often a model leaving the fleet looks for its last jobs' end
DRAIN_WAIT_S = 120.0  # longest it waits for them (a stuck job does not keep it forever)
BACKLOG_POLL_S = 0.1  # how often jobs that came without a request (ingest) are looked for
BACKLOG_WAIT_S = 30.0  # how long such jobs may wait for their model's load
MEASURES_FILE = "residency.json"  # the models' measured loads, beside the tuned profiles


@dataclass(frozen=True, slots=True)
class LocalTuning:
    """Tuning on this machine: the file its results are kept in (``cache_file``), how
    long a background tune may take, and what runs it (a child process; tests fake it)."""

    cache: Path
    budget_s: float = 300.0
    tuner: Tuner = tune_in_child


class ModelHost(Lifecycle):
    def __init__(
        self,
        fleet: Fleet | LiveFleet,
        queue: JobPuller,
        *,
        options: Collection[object] = (),
        device: Literal["auto", "cpu", "cuda"] = "auto",
        threads: int = 0,
        loaders: Mapping[str, Loader] | None = None,
        adapters: AdapterCatalog | None = None,
        tuned: TunedProfiles | None = None,
        untuned: Untuned = "background",
        adapter_models: Collection[str] = (),
        tuning: LocalTuning | None = None,
        memory_budget_mb: float = 0.0,
        backlog: Callable[[], Counter[str]] | None = None,
        memory_meter: MemoryMeter | None = None,
    ) -> None:
        """``options``: the engines' options, one object per type (the request limits of
        the encoders, the OCR limits); ``loaders``: by task kind, in place of the kind's
        own (tests and benchmarks load their own runtimes); ``tuning``: where this
        machine's tuned profiles are kept; without it (a host built in code) none is read
        or written and nothing is tuned in the background; ``memory_budget_mb``: what the
        models may hold (0: a share of the device's free memory); ``backlog``: the jobs
        waiting in the queue per model (a model with some is never evicted);
        ``memory_meter``: how the models' memory is measured (the device's own when None)."""
        self.fleet = fleet if isinstance(fleet, LiveFleet) else LiveFleet(fleet)
        # models that must take adapters though none is declared or registered at load
        # (a recipe search registers its trials' as it goes)
        self.adapter_models = frozenset(adapter_models)
        self.adapters = adapters or AdapterCatalog(self.fleet)
        self.queue = queue
        self.options = {type(option): option for option in options}
        self.device = device
        self.threads = threads
        self.loaders = dict(loaders or {})
        self.tuned = tuned or TunedProfiles()
        self.untuned = untuned
        self.tuning = tuning
        self.backlog = backlog or Counter
        self.choices: dict[str, ProfileChoice] = {}  # the profile each model runs with, why
        self.engines: dict[str, Engine] = {}  # by engine name
        self.served: dict[str, Engine] = {}  # model -> the engine serving it
        self.turns = DeviceTurns()  # the device, shared by the engines
        self.residents = Residents(
            memory_budget_mb,
            self._load_model,
            self._unload_model,
            self._busy,
            self._refuse,
            prepare=self._prepare_model,
        )
        for spec in self.fleet.models.values():
            self._track(spec)
        self._meter = memory_meter
        self._device: DeviceKind | None = None
        self._task: asyncio.Task[None] | None = None
        self._tuning_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._adding: set[asyncio.Task[None]] = set()  # loads of models added while serving
        self._to_tune: dict[str, ProfileChoice] = {}  # model -> the choice before tuning

    # -- ModelStates, LoadsOnDemand ------------------------------------------------

    @property
    def failed(self) -> dict[str, str]:
        """Models that failed to load, with why."""
        records = self.residents.records.values()
        return {r.name: r.error or "" for r in records if r.state == "failed"}

    def state(self, model: str) -> ModelState:
        record = self.residents.records.get(model)
        if record is None:
            return "failed"  # removed from the fleet
        if record.state != "ready":
            return record.state
        if self._task is None:  # stopped: it serves nothing, as before it started
            return "loading"
        engine = self.served.get(model)
        return "ready" if engine is not None and engine.healthy(model) else "failed"

    def describe(self, model: str) -> dict[str, object]:
        record = self.residents.records.get(model)
        residency = record.describe() if record is not None else {}
        engine = self.served.get(model)
        if engine is None or record is None or record.state != "ready":
            return residency
        if self._task is not None and not engine.healthy(model):
            return {
                **residency,
                "error": "its engine stopped (a bug: the server log has the traceback)",
            }
        profile = {"profile": self.choices[model].describe()} if model in self.choices else {}
        return {**(engine.describe(model) or {}), **profile, **residency}

    def demand(self, model: str, deadline: float) -> None:
        self.residents.demand(model, deadline)

    def choose_profile(self, spec: ModelSpec, device: DeviceKind) -> ProfileChoice:
        """The tuned profile for this device when the fleet leaves it open (dtype: auto),
        else the fleet's; with ``untuned='quick'`` an open one with no tuned profile is
        tuned briefly here. Blocking (a quick tune takes seconds): run in a thread."""
        adapters = self._takes_adapters(spec.name)
        fp = fingerprint(device)
        choice = profile_for(spec, device, fp, self.tuned, adapters=adapters)
        if choice.source == "fleet" and tunable(spec, device) is None and self.tuning:
            choice = self._machine_choice(spec, device, fp, adapters) or choice
        kind = kind_of(spec.task)
        if (
            kind.quick_tune is not None
            and choice.source == "fleet"
            and self.untuned == "quick"
            and spec.profile(device).dtype == "auto"
        ):
            loader = self._loader(kind)
            choice = kind.quick_tune(spec, device, loader, self.threads, choice.fingerprint)
        return choice

    def _takes_adapters(self, model: str) -> bool:
        return model in self.adapter_models or bool(self.adapters.names(model))

    def _machine_choice(
        self, spec: ModelSpec, device: DeviceKind, fp: str, adapters: bool
    ) -> ProfileChoice | None:
        """This machine's kept profile, or one borrowed from a machine like it."""
        assert self.tuning is not None
        cached = read_cache(self.tuning.cache)
        # The weights digest is computed only where the cache has something to compare.
        identity = identity_of(spec, self.tuning.cache) if spec.name in cached.models else None
        found = lookup(spec.name, fp, cached, self.tuned, identity)
        if found is None:
            return None
        entry, why = found.entry, found.why
        return as_choice(spec, device, fp, found.fingerprint, entry, found.source, why, adapters)

    def _loader(self, kind: TaskKind) -> Loader:
        """The kind's own loader, unless the host was given one for it."""
        return self.loaders.get(kind.name, kind.load)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._load_and_run(), name="model-host")

    async def wait_ready(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        # Back in the collector's sight, so what the process leaves is freed as it exits
        # (native bindings report frozen objects as leaks).
        gc.unfreeze()
        for task in (self._task, self._tuning_task, self._watch_task):
            if task is not None and not task.done():
                task.cancel()
        # Awaited, not only cancelled: the tuning task's child process is killed as it
        # ends, and a task left pending warns when it is collected.
        ended = [t for t in (self._tuning_task, self._watch_task, *self._adding) if t is not None]
        for task in self._adding:
            task.cancel()
        await asyncio.gather(*ended, return_exceptions=True)
        await self.residents.stop()
        self._task = self._tuning_task = self._watch_task = None
        for engine in self.engines.values():  # stopped, they still say what they loaded
            await engine.stop()

    def _measures(self, device: DeviceKind) -> Measures:
        """This device's measures of earlier loads, kept beside its tuned profiles; none
        kept for a host built in code (no ``tuning``)."""
        path = None if self.tuning is None else self.tuning.cache.parent / MEASURES_FILE
        return Measures(path, fingerprint(device))

    async def _load_and_run(self) -> None:
        device: DeviceKind = (
            await asyncio.to_thread(detect_device) if self.device == "auto" else self.device
        )
        self._device = device
        self.residents.attach(device, self._meter, await asyncio.to_thread(self._measures, device))
        try:
            for spec in list(self.fleet.models.values()):
                if spec.load == "start":
                    await self.residents.load(spec.name)
        finally:
            # What loading made (modules, models, tokenizers: hundreds of thousands of
            # objects) lives as long as the process: out of the collector's sight, so its
            # full passes stop pausing the requests. Measured: online p90 during an ingest
            # backlog (tests/distributed/test_worker_ingest.py) 440 ms without, 142 with.
            # Models loaded on demand later stay in its sight: their eviction frees them.
            gc.collect()
            gc.freeze()
        if self._to_tune:  # after every model loaded: a tune times nothing else's load
            self._tuning_task = asyncio.create_task(self._tune_all(device), name="tuning")
        self._watch_task = asyncio.create_task(self._load_on_backlog(), name="backlog-loads")

    async def _load_on_backlog(self) -> None:
        """Load an evicted model whose jobs wait in the queue: jobs that came without a
        request (ingest's) ask for no load, and a job caught by an evicted model's last
        pull is handed back to wait for its next load."""
        while True:
            await asyncio.sleep(BACKLOG_POLL_S)
            waiting = self.backlog()
            for name, residency in list(self.residents.records.items()):
                if residency.state == "evicted" and waiting[name] > 0:
                    # NotReady only says the load may not end in time: it goes on.
                    with contextlib.suppress(FlotillaError):
                        self.residents.demand(name, time.time() + BACKLOG_WAIT_S)

    def _track(self, spec: ModelSpec) -> None:
        estimate = None
        if spec.load == "on_demand":
            try:
                estimate = weights_bytes(spec.source.resolve())
            except (OSError, FlotillaError):  # its load will say what is wrong
                estimate = None
        on_demand = spec.load == "on_demand"
        family = json.dumps(
            spec.model_dump(mode="json", include={"task", "source", "profiles"}), sort_keys=True
        )
        self.residents.track(
            spec.name, pinned=spec.pinned, on_demand=on_demand, estimate=estimate, family=family
        )

    async def _prepare_model(self, name: str) -> str | None:
        """Import the libraries ``name``'s runtime loads with, before its load is measured;
        returns which runtime that was (``Prepare``)."""
        assert self._device is not None
        spec = self.fleet.get(name)
        kind = kind_of(spec.task)
        prepare = kind.prepare
        if prepare is None or kind.name in self.loaders:  # a loader of its own (a test's,
            return None  # a benchmark's) imports what it needs itself
        choice = await asyncio.to_thread(self.choose_profile, spec, self._device)
        await asyncio.to_thread(prepare, choice.apply(spec, self._device), self._device)
        return f"{kind.name}:{choice.profile.runtime}"

    async def _load_model(self, name: str) -> None:
        """Load ``name`` and serve it on its kind's engine; raises if it cannot."""
        assert self._device is not None
        device = self._device
        spec = self.fleet.get(name)
        kind = kind_of(spec.task)
        choice = await asyncio.to_thread(self.choose_profile, spec, device)
        # Only the models loaded at start are tuned in the background: one loaded on
        # demand serves on what it has (a later start, or `flotilla tune`, tunes it).
        starting = self._task is not None and not self._task.done()
        self.choices[name] = self._queue_tune(spec, device, choice) if starting else choice
        log.info("%s: %s profile: %s", name, choice.source, choice.why)
        spec = choice.apply(spec, device)
        threads = choice.profile.threads or self.threads
        runtime = await asyncio.to_thread(self._loader(kind), spec, device, threads)
        if spec.load == "on_demand" and kind.warm_up is not None:
            await asyncio.to_thread(kind.warm_up, runtime)
        engine = self.engines.get(kind.engine)
        if engine is None:
            context = EngineContext(self.queue, self.turns, device, self.adapters, self.options)
            engine = self.engines[kind.engine] = kind.make_engine(context)
        await engine.serve(spec, runtime)
        self.served[name] = engine
        log.info("loaded %s on %s: %s", name, device, getattr(runtime, "info", ""))

    async def _unload_model(self, name: str) -> None:
        engine = self.served.pop(name)
        if not isinstance(engine, Unloading):  # _busy() keeps such models resident
            raise TypeError(f"the engine serving {name!r} cannot unload a model")
        await engine.unserve(name)

    def _busy(self, name: str) -> bool:
        """Jobs in hand or waiting for ``name``; a model on an engine that cannot unload
        one counts as busy, so it is never evicted."""
        return not isinstance(self.served.get(name), Unloading) or self._busy_with_jobs(name)

    async def _refuse(self, name: str, error: FlotillaError) -> None:
        """Answer every job waiting for ``name`` with ``error``: it will not load in time."""
        while jobs := await self.queue.pull([name], 1 << 30, 0.0):
            for job in jobs:
                await self.queue.complete(job.id, error)

    # -- models joining and leaving (FleetAdmin) -----------------------------------

    async def add_model(self, spec: ModelSpec) -> None:
        self.fleet.add(spec)  # ValueError for a name taken: nothing changes
        self._track(spec)
        if spec.load == "start" and self._device is not None:
            self.residents.records[spec.name].on_demand = True  # it may load again later
            self._adding.add(asyncio.create_task(self.residents.load(spec.name)))
            self._adding = {task for task in self._adding if not task.done()}

    async def remove_model(self, name: str) -> None:
        self.fleet.remove(name)  # from now on requests for it are 404s
        await asyncio.gather(*self.residents.loading([name]), return_exceptions=True)
        waited = 0.0
        while name in self.served and self._busy_with_jobs(name) and waited < DRAIN_WAIT_S:
            await asyncio.sleep(DRAIN_POLL_S)
            waited += DRAIN_POLL_S
        if waited >= DRAIN_WAIT_S:
            log.warning("%s: still had jobs after %.0f s; unloading it", name, DRAIN_WAIT_S)
        await self.residents.evict(name, "as it left the fleet")
        self.residents.forget(name)
        self.choices.pop(name, None)

    def _busy_with_jobs(self, name: str) -> bool:
        return self.in_hand(name) > 0 or self.backlog()[name] > 0

    def in_hand(self, name: str) -> int:
        """Jobs of ``name`` its engine holds now (0 when it is not served)."""
        engine = self.served.get(name)
        return engine.in_hand(name) if isinstance(engine, Unloading) else 0

    def hostable(self) -> list[str]:
        """The on-demand models this device could load (``Residents.hostable``)."""
        return self.residents.hostable()

    # -- tuning in the background ----------------------------------------------

    def _queue_tune(
        self, spec: ModelSpec, device: DeviceKind, choice: ProfileChoice
    ) -> ProfileChoice:
        """The choice as shown while it waits for a background tune, if it gets one."""
        if not (
            self.untuned == "background"
            and self.tuning is not None
            and kind_of(spec.task).quick_tune is not None
            and choice.source in ("fleet", "borrowed")
            and tunable(spec, device) is None
        ):
            return choice
        self._to_tune[spec.name] = choice
        if choice.source == "borrowed":
            return replace(choice, why=f"{choice.why}; a tune here confirms or replaces it")
        return replace(choice, source="tuning", why=f"{choice.why} while a tune runs")

    async def _tune_all(self, device: DeviceKind) -> None:
        """One model at a time: two tunes at once would time each other."""
        for name, before in list(self._to_tune.items()):
            if name in self.served:
                await self._tune(self.fleet.models[name], device, before)
        self._to_tune.clear()

    async def _tune(self, spec: ModelSpec, device: DeviceKind, before: ProfileChoice) -> None:
        assert self.tuning is not None
        budget = self.tuning.budget_s
        log.info(
            "%s: tuning in the background, at most %.0f s (--tune-budget-s)", spec.name, budget
        )
        started = time.monotonic()
        try:
            entry = await self.tuning.tuner(spec, device, self.threads, budget)
        except Exception:  # a failed tune leaves the model as it serves
            log.exception("%s: the background tune failed", spec.name)
            entry = None
        took = time.monotonic() - started
        if entry is None:
            self.choices[spec.name] = before
            log.info("%s: tune done in %.0f s, nothing changes: %s", spec.name, took, before.why)
            return
        await asyncio.to_thread(self._keep, spec, before.fingerprint, entry)
        why = f"tuned on this machine in the background in {took:.0f} s"
        adapters = self._takes_adapters(spec.name)
        fp = before.fingerprint
        choice = as_choice(spec, device, fp, fp, entry, "cached", why, adapters)
        if choice is None:
            self.choices[spec.name] = before
            log.info(
                "%s: the tuned runtime cannot take its adapters: it keeps %s", spec.name, before.why
            )
        elif self._same(choice, before):
            self.choices[spec.name] = choice
            log.info(
                "%s: tune done in %.0f s; it confirms the profile served: %s",
                spec.name,
                took,
                choice.why,
            )
        else:
            await self._switch(spec, device, choice, before)

    def _keep(self, spec: ModelSpec, fp: str, entry: TunedEntry) -> None:
        assert self.tuning is not None
        try:
            record(self.tuning.cache, spec.name, fp, entry, identity_of(spec, self.tuning.cache))
        except Exception:  # serving goes on; the next start tunes again
            log.exception(
                "%s: keeping the tuned profile in %s failed", spec.name, self.tuning.cache
            )
        else:
            log.info("%s: tuned profile kept in %s", spec.name, self.tuning.cache)

    def _same(self, choice: ProfileChoice, before: ProfileChoice) -> bool:
        def fields(c: ProfileChoice) -> dict[str, object]:
            got = c.profile.model_dump(include=set(TUNED_FIELDS))
            got["threads"] = got.get("threads") or self.threads or usable_cores()
            return got

        return fields(choice) == fields(before)

    async def _switch(
        self, spec: ModelSpec, device: DeviceKind, choice: ProfileChoice, before: ProfileChoice
    ) -> None:
        """Load the tuned runtime beside the serving one (a low-priority thread), move the
        model to it between two batches, then free the old one."""
        engine = self.served.get(spec.name)
        if not isinstance(engine, Switching):
            self.choices[spec.name] = before
            log.info("%s: its engine cannot switch runtimes; it keeps its profile", spec.name)
            return
        tuned = choice.apply(spec, device)
        threads = choice.profile.threads or self.threads
        started = time.monotonic()
        try:
            runtime = await in_low_priority_thread(
                self._loader(kind_of(spec.task)), tuned, device, threads
            )
            await engine.switch(tuned, runtime)
        except Exception:  # the old runtime still serves
            self.choices[spec.name] = before
            log.exception("%s: switching to the tuned profile failed; it keeps its own", spec.name)
            return
        self.choices[spec.name] = choice
        log.info(
            "%s: switched to the tuned profile in %.1f s, between batches: %s",
            spec.name, time.monotonic() - started, choice.why,
        )  # fmt: skip
        # The old runtime is freed by reference counting as the switch lets go of it, no
        # collector pass needed (its torch parameters were, in a check); a full pass over
        # the frozen load would pause the event loop instead (0.68 s, a served request's
        # answer held, on a loaded 2-core Xeon).


def as_choice(
    spec: ModelSpec,
    device: DeviceKind,
    fp: str,
    tuned_on: str,
    entry: TunedEntry,
    source: ProfileSource,
    why: str,
    adapters: bool,
) -> ProfileChoice | None:
    """``entry`` (tuned on ``tuned_on``) as this device's choice, labelled ``source``;
    None when neither its runtime nor its runner-up can take the adapters the model
    serves (``profile_for`` decides, as for the shipped profiles)."""
    chosen = profile_for(
        spec,
        device,
        tuned_on,
        TunedProfiles().with_entry(spec.name, tuned_on, entry),
        adapters=adapters,
    )
    if chosen.source != "tuned":
        return None
    return replace(chosen, source=source, fingerprint=fp, why=f"{why}; {chosen.why}")
