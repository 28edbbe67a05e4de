"""Loads the fleet onto this machine's device and runs its worker.

Models load in a thread after start-up so the HTTP side answers probes (and
503s) at once; the worker starts pulling when the first model is loaded and
takes on each further model as it loads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict
from typing import Literal

from embedder.adapters import AdapterCatalog, ResidentAdapters
from embedder.batching import BatchLimits
from embedder.codecs import RequestLimits
from embedder.device import fingerprint
from embedder.execute import LoadedModel
from embedder.fleet import DeviceKind, Fleet, ModelSpec
from embedder.jobs import ModelState
from embedder.lifecycle import Lifecycle
from embedder.queue import JobPuller
from embedder.runtimes import Runtime, detect_device, load_runtime
from embedder.tuned import ProfileChoice, TunedProfiles, profile_for
from embedder.worker import Worker

log = logging.getLogger(__name__)

RuntimeLoader = Callable[[ModelSpec, DeviceKind, int], Runtime]


class ModelHost(Lifecycle):
    def __init__(
        self,
        fleet: Fleet,
        queue: JobPuller,
        request_limits: RequestLimits,
        *,
        device: Literal["auto", "cpu", "cuda"] = "auto",
        threads: int = 0,
        loader: RuntimeLoader = load_runtime,
        adapters: AdapterCatalog | None = None,
        tuned: TunedProfiles | None = None,
        untuned: Literal["defaults", "quick"] = "defaults",
    ) -> None:
        self.fleet = fleet
        self.adapters = adapters or AdapterCatalog(fleet)
        self.queue = queue
        self.request_limits = request_limits
        self.device = device
        self.threads = threads
        self.loader = loader
        self.tuned = tuned or TunedProfiles()
        self.untuned = untuned
        self.choices: dict[str, ProfileChoice] = {}  # the profile each model runs with, why
        self.loaded: dict[str, LoadedModel] = {}
        self.failed: dict[str, str] = {}
        self.worker: Worker | None = None
        self._task: asyncio.Task[None] | None = None

    # -- ModelStates -----------------------------------------------------

    def state(self, model: str) -> ModelState:
        if model in self.failed:
            return "failed"
        return "ready" if self.worker is not None and model in self.loaded else "loading"

    def describe(self, model: str) -> dict[str, object]:
        profile = {"profile": self.choices[model].describe()} if model in self.choices else {}
        if model in self.loaded:
            return {**asdict(self.loaded[model].runtime.info), **profile}
        if model in self.failed:
            return {"error": self.failed[model]}
        return {}

    def choose_profile(self, spec: ModelSpec, device: DeviceKind) -> ProfileChoice:
        """The tuned profile for this device when the fleet leaves it open (dtype: auto),
        else the fleet's; with ``untuned='quick'`` an open one with no tuned profile is
        tuned briefly here. Blocking (a quick tune takes seconds): run in a thread."""
        choice = profile_for(spec, device, fingerprint(device), self.tuned)
        if (
            choice.source == "fleet"
            and self.untuned == "quick"
            and spec.profile(device).dtype == "auto"
        ):
            from embedder.tuning.quick import quick_choice

            choice = quick_choice(spec, device, self.loader, self.threads, choice.fingerprint)
        return choice

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._load_and_run(), name="model-host")

    async def wait_ready(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        if self.worker is not None:
            await self.worker.stop()
            self.worker = None

    async def _load_and_run(self) -> None:
        device: DeviceKind = (
            await asyncio.to_thread(detect_device) if self.device == "auto" else self.device
        )
        for name, spec in self.fleet.models.items():
            try:
                choice = await asyncio.to_thread(self.choose_profile, spec, device)
                self.choices[name] = choice
                log.info("%s: %s profile: %s", name, choice.source, choice.why)
                spec = choice.apply(spec, device)
                threads = choice.profile.threads or self.threads
                runtime = await asyncio.to_thread(self.loader, spec, device, threads)
            except Exception as exc:  # one bad model must not take the fleet down
                log.exception("model %s failed to load", name)
                self.failed[name] = f"{type(exc).__name__}: {exc}"
                continue
            profile = spec.profile(device)
            limits = BatchLimits(
                max_tokens=profile.max_batch_tokens,
                max_requests=profile.max_batch_requests,
                max_wait_s=profile.max_wait_ms / 1e3,
                mix_adapters=profile.mix_adapters,
                latency_target_s=None
                if profile.latency_target_ms is None
                else profile.latency_target_ms / 1e3,
            )
            resident = ResidentAdapters(
                profile.max_resident_adapters, runtime.load_adapter, runtime.unload_adapter
            )
            model = LoadedModel(spec, runtime, limits, self.adapters, resident)
            self.loaded[name] = model
            log.info("loaded %s on %s: %s", name, device, runtime.info)
            # Serve each model as soon as it is loaded: a fleet's first model does not wait
            # for a large one behind it (or for that one's first-load import).
            if self.worker is None:
                worker = Worker(self.queue, {name: model}, self.request_limits)
                await worker.start()
                self.worker = worker
            else:
                self.worker.add_model(model)
