"""Loads the fleet onto this machine's device and runs its worker.

Models load in a thread after start-up so the HTTP side answers probes (and
503s) at once; the worker starts pulling when the first model is loaded and
takes on each further model as it loads. A generation model gets an engine of its own
(``embedder.tasks.generate.engine``) that pulls its jobs from the same queue, and so does an
OCR model (``embedder.tasks.ocr.engine``); the embedding worker and the engines take turns on
the one device (``embedder.serving.turns``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Collection
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Literal

from embedder.core.adapters import AdapterCatalog, ResidentAdapters
from embedder.tasks.embed.batching import BatchLimits
from embedder.tasks.embed.codecs import RequestLimits
from embedder.core.device import fingerprint
from embedder.tasks.embed.execute import LoadedModel
from embedder.core.fleet import DeviceKind, Fleet, ModelSpec
from embedder.core.jobs import ModelState, Task
from embedder.core.lifecycle import Lifecycle
from embedder.tasks.ocr.api import OcrLimits
from embedder.queue import JobPuller
from embedder.tasks.embed.runtimes import Runtime, detect_device, load_runtime
from embedder.tuned import ProfileChoice, TunedProfiles, profile_for
from embedder.serving.turns import DeviceTurns
from embedder.tasks.embed.worker import Worker

if TYPE_CHECKING:
    from embedder.tasks.generate.engine import GenerationEngine
    from embedder.tasks.generate.runtime import GenerationRuntime
    from embedder.tasks.ocr.engine import OcrEngine
    from embedder.tasks.ocr.runtime import OcrRuntime

log = logging.getLogger(__name__)

RuntimeLoader = Callable[[ModelSpec, DeviceKind, int], Runtime]
GeneratorLoader = Callable[[ModelSpec, DeviceKind, int], "GenerationRuntime"]
OcrLoader = Callable[[ModelSpec, DeviceKind, int], "OcrRuntime"]


def load_generator(spec: ModelSpec, device: DeviceKind, threads: int) -> GenerationRuntime:
    from embedder.tasks.generate.runtime import load  # torch: only where a generator loads

    return load(spec, device, threads)


def load_ocr(spec: ModelSpec, device: DeviceKind, threads: int) -> OcrRuntime:
    from embedder.tasks.ocr.runtime import load_ocr  # ONNX Runtime and OpenCV: only where OCR loads

    return load_ocr(spec, device, threads)


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
        generator_loader: GeneratorLoader = load_generator,
        ocr_loader: OcrLoader = load_ocr,
        ocr_limits: OcrLimits | None = None,
        adapter_models: Collection[str] = (),
    ) -> None:
        self.fleet = fleet
        # models that must take adapters though none is declared or registered at load
        # (a recipe search registers its trials' as it goes)
        self.adapter_models = frozenset(adapter_models)
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
        self.generator_loader = generator_loader
        self.generators: dict[str, GenerationEngine] = {}
        self.ocr_loader = ocr_loader
        self.ocr_limits = ocr_limits or OcrLimits()
        self.readers: dict[str, OcrEngine] = {}  # the OCR models' engines
        self.turns = DeviceTurns()  # the device, shared by the worker and the engines
        self._task: asyncio.Task[None] | None = None

    # -- ModelStates -----------------------------------------------------

    def state(self, model: str) -> ModelState:
        if model in self.failed:
            return "failed"
        if model in self.generators or model in self.readers:
            return "ready"
        return "ready" if self.worker is not None and model in self.loaded else "loading"

    def describe(self, model: str) -> dict[str, object]:
        profile = {"profile": self.choices[model].describe()} if model in self.choices else {}
        if model in self.generators:
            return {**asdict(self.generators[model].runtime.info), **profile}
        if model in self.readers:
            return {**asdict(self.readers[model].runtime.info), **profile}
        if model in self.loaded:
            return {**asdict(self.loaded[model].runtime.info), **profile}
        if model in self.failed:
            return {"error": self.failed[model]}
        return {}

    def choose_profile(self, spec: ModelSpec, device: DeviceKind) -> ProfileChoice:
        """The tuned profile for this device when the fleet leaves it open (dtype: auto),
        else the fleet's; with ``untuned='quick'`` an open one with no tuned profile is
        tuned briefly here. Blocking (a quick tune takes seconds): run in a thread."""
        adapters = spec.name in self.adapter_models or bool(self.adapters.names(spec.name))
        choice = profile_for(spec, device, fingerprint(device), self.tuned, adapters=adapters)
        if (
            spec.task not in (Task.GENERATE, Task.OCR)  # the quick tune times embedders
            and choice.source == "fleet"
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
        # Back in the collector's sight, so what the process leaves is freed as it exits
        # (native bindings report frozen objects as leaks).
        gc.unfreeze()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        if self.worker is not None:
            await self.worker.stop()
            self.worker = None
        engines, self.generators = list(self.generators.values()), {}
        for engine in engines:
            await engine.stop()
        readers, self.readers = list(self.readers.values()), {}
        for reader in readers:
            await reader.stop()

    async def _load_and_run(self) -> None:
        device: DeviceKind = (
            await asyncio.to_thread(detect_device) if self.device == "auto" else self.device
        )
        try:
            await self._load_all(device)
        finally:
            # What loading made (modules, models, tokenizers: hundreds of thousands of
            # objects) lives as long as the process: out of the collector's sight, so its
            # full passes stop pausing the requests. Measured: online p90 during an ingest
            # backlog (tests/distributed/test_worker_ingest.py) 440 ms without, 142 with.
            gc.collect()
            gc.freeze()

    async def _load_all(self, device: DeviceKind) -> None:
        for name, spec in self.fleet.models.items():
            try:
                choice = await asyncio.to_thread(self.choose_profile, spec, device)
                self.choices[name] = choice
                log.info("%s: %s profile: %s", name, choice.source, choice.why)
                spec = choice.apply(spec, device)
                threads = choice.profile.threads or self.threads
                loaders: dict[Task, Callable[[ModelSpec, DeviceKind, int], Any]] = {
                    Task.GENERATE: self.generator_loader,
                    Task.OCR: self.ocr_loader,
                }
                loader = loaders.get(spec.task, self.loader)
                runtime = await asyncio.to_thread(loader, spec, device, threads)
            except Exception as exc:  # one bad model must not take the fleet down
                log.exception("model %s failed to load", name)
                self.failed[name] = f"{type(exc).__name__}: {exc}"
                continue
            if spec.task is Task.GENERATE:
                await self._serve_generator(spec, runtime, device)
                continue
            if spec.task is Task.OCR:
                await self._serve_reader(spec, runtime, device)
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
                worker = Worker(self.queue, {name: model}, self.request_limits, turns=self.turns)
                await worker.start()
                self.worker = worker
            else:
                self.worker.add_model(model)

    async def _serve_generator(
        self, spec: ModelSpec, runtime: GenerationRuntime, device: DeviceKind
    ) -> None:
        from embedder.tasks.generate.engine import GenerationEngine

        engine = GenerationEngine(self.queue, spec, runtime, self.turns)
        await engine.start()
        self.generators[spec.name] = engine
        log.info("loaded %s on %s: %s", spec.name, device, runtime.info)

    async def _serve_reader(self, spec: ModelSpec, runtime: OcrRuntime, device: DeviceKind) -> None:
        from embedder.tasks.ocr.engine import OcrEngine

        engine = OcrEngine(self.queue, spec, runtime, self.turns, self.ocr_limits, device)
        await engine.start()
        self.readers[spec.name] = engine
        log.info("loaded %s on %s: %s", spec.name, device, runtime.info)
