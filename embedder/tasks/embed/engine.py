"""The encoder engine: embedding and rerank models of a device in one pipelined worker
(``worker``), which forms batches across them and runs them one at a time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import Any

from embedder.core.adapters import ResidentAdapters
from embedder.core.errors import AdapterBuilding, FlotillaError
from embedder.core.fleet import ModelSpec
from embedder.tasks.embed.batching import BatchLimits
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.execute import LoadedModel
from embedder.tasks.embed.spec import ENGINE, EncoderProfile, EncoderSpec
from embedder.tasks.embed.worker import Worker
from embedder.tasks.kind import Engine, EngineContext

log = logging.getLogger(__name__)

# After a switch, how often and how long to wait for the batches still on the old
# runtime (at most three: one finishing, one on the device, one prepared ahead).
RELEASE_POLL_S = 0.005
RELEASE_WAIT_S = 60.0


def batch_limits(profile: EncoderProfile) -> BatchLimits:
    target = profile.latency_target_ms
    return BatchLimits(
        max_tokens=profile.max_batch_tokens,
        max_requests=profile.max_batch_requests,
        max_wait_s=profile.max_wait_ms / 1e3,
        mix_adapters=profile.mix_adapters,
        latency_target_s=None if target is None else target / 1e3,
    )


class EncoderEngine:
    def __init__(self, context: EngineContext) -> None:
        self.context = context
        self.loaded: dict[str, LoadedModel] = {}
        self.worker: Worker | None = None

    def _loaded_model(self, spec: ModelSpec, runtime: Any) -> LoadedModel:
        assert isinstance(spec, EncoderSpec)
        profile = spec.profile(self.context.device)
        resident = ResidentAdapters(
            profile.max_resident_adapters, runtime.load_adapter, runtime.unload_adapter
        )
        model = LoadedModel(spec, runtime, batch_limits(profile), self.context.adapters, resident)
        self._prepare_adapters(model)
        return model

    async def serve(self, spec: ModelSpec, runtime: Any) -> None:
        model = self._loaded_model(spec, runtime)
        self.loaded[spec.name] = model
        if self.worker is not None:
            self.worker.add_model(model)
            return
        limits = self.context.option(RequestLimits)
        worker = Worker(self.context.queue, {spec.name: model}, limits, turns=self.context.turns)
        await worker.start()
        self.worker = worker

    def _prepare_adapters(self, model: LoadedModel) -> None:
        """Let the runtime build ahead (in the background) for the adapters known now, so
        their first requests need not wait for it; ones registered later build on first
        use. An adapter that cannot serve says so when it is first asked for."""
        if model.catalog is None:
            return
        try:
            known = model.catalog.names(model.spec.name)
        except (OSError, FlotillaError):
            log.warning("cannot list the adapters of %s to prepare them", model.spec.name)
            return
        for name, folder in known.items():
            model.runtime.prepare_adapter(name, folder)

    async def switch(self, spec: ModelSpec, runtime: Any) -> None:
        """Serve ``spec`` (a model already served) with ``runtime`` from the next batch on,
        then let the old runtime go once no batch holds it. The new runtime first runs a
        warm-up pass and loads the adapters resident in the old (in a thread: the loop
        goes on meanwhile), so no request pays for its first call and the adapters' next
        requests find them; one that fails to load there loads on demand. A warm-up that
        fails raises: the old runtime serves on."""
        old = self.loaded[spec.name]
        model = self._loaded_model(spec, runtime)
        await asyncio.to_thread(warm_up, runtime)
        if old.resident is not None and model.resident is not None and old.resident.folders:
            failed = await asyncio.to_thread(model.resident.ensure, old.resident.folders)
            for name, error in failed.items():
                if isinstance(error, AdapterBuilding):  # held for its graph, not failed
                    continue
                log.warning(
                    "%s: adapter %s did not load on the new runtime: %s", spec.name, name, error
                )
        worker = self.worker
        self.loaded[spec.name] = model
        if worker is None:
            return
        await self._released(worker, worker.replace_model(model))

    def in_hand(self, model: str) -> int:
        return 0 if self.worker is None else self.worker.in_hand(model)

    async def unserve(self, model: str) -> None:
        loaded = self.loaded.pop(model)
        worker = self.worker
        if worker is None:
            return
        worker.remove_model(model)
        await self._released(worker, loaded)

    async def _released(self, worker: Worker, model: LoadedModel) -> None:
        """Wait until no batch prepared with ``model`` is still on its way through."""
        waited = 0.0
        while worker.holds(model) and worker.running() and waited < RELEASE_WAIT_S:
            await asyncio.sleep(RELEASE_POLL_S)
            waited += RELEASE_POLL_S

    def describe(self, model: str) -> dict[str, object] | None:
        loaded = self.loaded.get(model)
        return None if loaded is None else asdict(loaded.runtime.info)

    def healthy(self, model: str) -> bool:
        return model in self.loaded and self.worker is not None and self.worker.running()

    async def stop(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            await worker.stop()


WARM_UP_TEXTS = ("a short query", "a longer passage, " * 24)


def warm_up(runtime: Any) -> None:
    """One small forward pass. A runtime's first call picks or compiles its kernels
    (OpenVINO's took 0.6 s for MiniLM on a 2-core Xeon, against 40 ms after): paid
    here, off the serving path."""
    if runtime.info.kind == "cross-encoder":
        encoded = runtime.tokenize_pairs(WARM_UP_TEXTS[0], WARM_UP_TEXTS, "right")
    else:
        encoded = runtime.tokenize(WARM_UP_TEXTS, "right")
    runtime.forward(encoded)


class LoadedEncoders(Mapping[str, LoadedModel]):
    """The encoder models a host has loaded, as they load: a live view over the host's
    engines (ingest counts passages with their tokenizers; a relay sizes its take by
    their batch budgets)."""

    def __init__(self, engines: Mapping[str, Engine]) -> None:
        self.engines = engines

    def _loaded(self) -> dict[str, LoadedModel]:
        engine = self.engines.get(ENGINE)
        return engine.loaded if isinstance(engine, EncoderEngine) else {}

    def __getitem__(self, name: str) -> LoadedModel:
        return self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())
