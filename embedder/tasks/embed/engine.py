"""The encoder engine: embedding and rerank models of a device in one pipelined worker
(``worker``), which forms batches across them and runs them one at a time."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import Any

from embedder.core.adapters import ResidentAdapters
from embedder.core.errors import FlotillaError
from embedder.core.fleet import ModelSpec
from embedder.tasks.embed.batching import BatchLimits
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.execute import LoadedModel
from embedder.tasks.embed.spec import ENGINE, EncoderProfile, EncoderSpec
from embedder.tasks.embed.worker import Worker
from embedder.tasks.kind import Engine, EngineContext

log = logging.getLogger(__name__)


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

    async def serve(self, spec: ModelSpec, runtime: Any) -> None:
        assert isinstance(spec, EncoderSpec)
        profile = spec.profile(self.context.device)
        resident = ResidentAdapters(
            profile.max_resident_adapters, runtime.load_adapter, runtime.unload_adapter
        )
        model = LoadedModel(spec, runtime, batch_limits(profile), self.context.adapters, resident)
        self._prepare_adapters(model)
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

    def describe(self, model: str) -> dict[str, object] | None:
        loaded = self.loaded.get(model)
        return None if loaded is None else asdict(loaded.runtime.info)

    def healthy(self, model: str) -> bool:
        return model in self.loaded and self.worker is not None and self.worker.running()

    async def stop(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            await worker.stop()


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
