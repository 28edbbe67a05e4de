"""Loads the fleet onto this machine's device and serves each model on its kind's engine.

Models load in a thread after start-up so the HTTP side answers probes (and 503s) at
once; each model is served as soon as it is loaded, so a fleet's first model does not
wait for a large one behind it. The host knows task kinds only through the registry
(``embedder.tasks.registry``): each model's kind loads it and names the engine it runs
in, one engine per name on this device, all taking turns on the one device
(``embedder.serving.turns``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Collection, Mapping
from typing import Literal

from embedder.core.adapters import AdapterCatalog
from embedder.core.device import detect_device, fingerprint
from embedder.core.fleet import DeviceKind, Fleet, ModelSpec
from embedder.core.jobs import ModelState
from embedder.core.lifecycle import Lifecycle
from embedder.queue import JobPuller
from embedder.serving.turns import DeviceTurns
from embedder.tasks.kind import Engine, EngineContext, Loader, TaskKind
from embedder.tasks.registry import kind_of
from embedder.tuned import ProfileChoice, TunedProfiles, profile_for

log = logging.getLogger(__name__)


class ModelHost(Lifecycle):
    def __init__(
        self,
        fleet: Fleet,
        queue: JobPuller,
        *,
        options: Collection[object] = (),
        device: Literal["auto", "cpu", "cuda"] = "auto",
        threads: int = 0,
        loaders: Mapping[str, Loader] | None = None,
        adapters: AdapterCatalog | None = None,
        tuned: TunedProfiles | None = None,
        untuned: Literal["defaults", "quick"] = "defaults",
        adapter_models: Collection[str] = (),
    ) -> None:
        """``options``: the engines' options, one object per type (the request limits of
        the encoders, the OCR limits); ``loaders``: by task kind, in place of the kind's
        own (tests and benchmarks load their own runtimes)."""
        self.fleet = fleet
        # models that must take adapters though none is declared or registered at load
        # (a recipe search registers its trials' as it goes)
        self.adapter_models = frozenset(adapter_models)
        self.adapters = adapters or AdapterCatalog(fleet)
        self.queue = queue
        self.options = {type(option): option for option in options}
        self.device = device
        self.threads = threads
        self.loaders = dict(loaders or {})
        self.tuned = tuned or TunedProfiles()
        self.untuned = untuned
        self.choices: dict[str, ProfileChoice] = {}  # the profile each model runs with, why
        self.engines: dict[str, Engine] = {}  # by engine name
        self.served: dict[str, Engine] = {}  # model -> the engine serving it
        self.failed: dict[str, str] = {}
        self.turns = DeviceTurns()  # the device, shared by the engines
        self._task: asyncio.Task[None] | None = None

    # -- ModelStates -----------------------------------------------------

    def state(self, model: str) -> ModelState:
        if model in self.failed:
            return "failed"
        engine = self.served.get(model)
        if engine is None or self._task is None:
            return "loading"
        return "ready" if engine.healthy(model) else "failed"

    def describe(self, model: str) -> dict[str, object]:
        if model in self.failed:
            return {"error": self.failed[model]}
        engine = self.served.get(model)
        if engine is None:
            return {}
        if self._task is not None and not engine.healthy(model):
            return {"error": "its engine stopped (a bug: the server log has the traceback)"}
        profile = {"profile": self.choices[model].describe()} if model in self.choices else {}
        return {**(engine.describe(model) or {}), **profile}

    def choose_profile(self, spec: ModelSpec, device: DeviceKind) -> ProfileChoice:
        """The tuned profile for this device when the fleet leaves it open (dtype: auto),
        else the fleet's; with ``untuned='quick'`` an open one with no tuned profile is
        tuned briefly here. Blocking (a quick tune takes seconds): run in a thread."""
        adapters = spec.name in self.adapter_models or bool(self.adapters.names(spec.name))
        choice = profile_for(spec, device, fingerprint(device), self.tuned, adapters=adapters)
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
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        for engine in self.engines.values():  # stopped, they still say what they loaded
            await engine.stop()

    async def _load_and_run(self) -> None:
        device: DeviceKind = (
            await asyncio.to_thread(detect_device) if self.device == "auto" else self.device
        )
        try:
            for spec in self.fleet.models.values():
                await self._load_one(spec, device)
        finally:
            # What loading made (modules, models, tokenizers: hundreds of thousands of
            # objects) lives as long as the process: out of the collector's sight, so its
            # full passes stop pausing the requests. Measured: online p90 during an ingest
            # backlog (tests/distributed/test_worker_ingest.py) 440 ms without, 142 with.
            gc.collect()
            gc.freeze()

    async def _load_one(self, spec: ModelSpec, device: DeviceKind) -> None:
        kind = kind_of(spec.task)
        try:
            choice = await asyncio.to_thread(self.choose_profile, spec, device)
            self.choices[spec.name] = choice
            log.info("%s: %s profile: %s", spec.name, choice.source, choice.why)
            spec = choice.apply(spec, device)
            threads = choice.profile.threads or self.threads
            loader = self._loader(kind)
            runtime = await asyncio.to_thread(loader, spec, device, threads)
        except Exception as exc:  # one bad model must not take the fleet down
            log.exception("model %s failed to load", spec.name)
            self.failed[spec.name] = f"{type(exc).__name__}: {exc}"
            return
        engine = self.engines.get(kind.engine)
        if engine is None:
            context = EngineContext(self.queue, self.turns, device, self.adapters, self.options)
            engine = self.engines[kind.engine] = kind.make_engine(context)
        await engine.serve(spec, runtime)
        self.served[spec.name] = engine
        log.info("loaded %s on %s: %s", spec.name, device, getattr(runtime, "info", ""))
