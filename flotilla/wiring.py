"""The wiring: what each command runs, built from the one settings object.

Each concept is assembled here once (the fleet as configured, the adapter catalog,
the vector store, the model host, the ingest core, the gateway's config, logging and
the HTTP server, set up in ``flotilla.http_server``), so every command in ``serve``,
``distributed``, ``ingest`` and ``evaluate`` is a few lines over these builders. The
packages below (``gateway``, ``embedder``, ``ingest``) never import this module or the
settings: they take the small objects built here, and the settings' sections, which
are their own config objects, as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from embedder.core.adapters import AdapterCatalog
from embedder.core.errors import ModelNotFound
from embedder.core.fleet import Fleet, FleetView, LiveFleet, ModelSpec
from embedder.core.jobs import Task, split_model
from embedder.host import LocalTuning, ModelHost
from embedder.queue import JobPuller
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.engine import LoadedEncoders
from embedder.tasks.fleet import load_fleet
from embedder.tasks.kind import Loader
from embedder.tasks.registry import encoder_loaders
from embedder.tuned import serving_profiles
from embedder.tuning.background import tune_in_child
from embedder.tuning.cache import cache_file
from flotilla import __version__
from flotilla.fleet_state import FleetStateFile
from flotilla.http_server import server_config
from flotilla.logs import quiet_repeats
from flotilla.settings import Settings
from flotilla.signals import unless_stopped
from gateway.config import GatewayConfig
from ingest.chunking import Chunking
from ingest.embedding import QueueEmbedder, model_windows
from ingest.kafka_source import KafkaSource
from ingest.pipeline import IngestCore
from ingest.reading import QueueReader
from ingest.records import RecordRules
from ingest.store import CollectionNotFound, VectorStore, open_store
from ingest.supervisor import IngestSupervisor


def configured_fleet(settings: Settings, kept: FleetStateFile | None = None) -> Fleet:
    """The fleet file's models, imported ones written under --model-cache-dir; with
    ``kept`` (`flotilla serve --fleet-state`), the changes made while serving applied."""
    fleet = load_fleet(settings.fleet)
    if kept is not None:
        fleet = kept.apply(fleet)
    return fleet.with_model_cache(settings.model_cache_dir)


def imports_cached(settings: Settings) -> Callable[[ModelSpec], ModelSpec]:
    """What ``configured_fleet`` does to each entry, for one added while serving."""

    def prepare(spec: ModelSpec) -> ModelSpec:
        alone = Fleet.model_validate({"models": {spec.name: spec}})
        return alone.with_model_cache(settings.model_cache_dir).models[spec.name]

    return prepare


def adapter_catalog(settings: Settings, fleet: FleetView) -> AdapterCatalog:
    return AdapterCatalog(fleet, settings.adapters_root)


def gateway_config(settings: Settings) -> GatewayConfig:
    return GatewayConfig(
        version=__version__,
        bytes_per_token=settings.bytes_per_token,
        max_documents_per_request=settings.ingest.max_records,
        limits=settings.gateway,
        ocr=settings.ocr,
    )


def configured_store(settings: Settings, *, serving_url: str | None = None) -> VectorStore:
    """The vector store; an embedded one names ``serving_url`` (this process's server,
    if it runs one) to any other process that tries to open a collection it owns."""
    if settings.store == "qdrant":
        if not settings.qdrant_url:
            raise SystemExit("--store qdrant needs --qdrant-url (FLOTILLA_QDRANT_URL)")
        key = settings.qdrant_api_key
        return open_store(
            "qdrant",
            url=settings.qdrant_url,
            api_key=None if key is None else key.get_secret_value(),
            ca_file=settings.qdrant_ca_file,
            client_cert=settings.qdrant_client_cert,
            client_key=settings.qdrant_client_key,
        )
    return open_store("edge", data_dir=settings.data_dir, serving_url=serving_url)


def server_url(settings: Settings) -> str | None:
    """Where this process's HTTP API is reached from this machine (None on a port chosen
    at start): a wildcard bind is reached on loopback."""
    if settings.port == 0:
        return None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(settings.host, settings.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.port}"


def ingest_models(settings: Settings) -> list[str]:
    """The models an ingest command loads: the one documents are embedded with unless
    a record names another (--model, else the fleet's first), and the OCR model that
    reads records carrying an image or PDF, if the fleet has one. A --model or
    --ingest-ocr-model the fleet lacks fails here, before anything loads."""
    fleet = configured_fleet(settings)
    embedding = settings.ingest.model or fleet.default_model
    if settings.ingest.model is not None:
        record_rules(settings, fleet, adapter_catalog(settings, fleet))
    reader = ocr_model(settings, fleet)
    return [embedding] if reader is None or reader == embedding else [embedding, reader]


def ocr_model(settings: Settings, fleet: FleetView) -> str | None:
    """The model that reads ingested images and PDFs: --ingest-ocr-model, else the fleet's
    first OCR model; None when the fleet has none."""
    if settings.ingest.ocr_model is None:
        return next((n for n, s in fleet.models.items() if s.task == Task.OCR), None)
    try:
        spec = fleet.get(settings.ingest.ocr_model)
    except ModelNotFound:
        spec = None
    if spec is None or spec.task != Task.OCR:
        readers = [n for n, s in fleet.models.items() if s.task == Task.OCR]
        raise SystemExit(
            f"--ingest-ocr-model {settings.ingest.ocr_model!r} (FLOTILLA_INGEST_OCR_MODEL) is "
            "not an OCR model of the fleet; its OCR models: " + (", ".join(readers) or "none")
        )
    return spec.name


def record_rules(settings: Settings, fleet: FleetView, adapters: AdapterCatalog) -> RecordRules:
    def resolve(name: str) -> str | None:
        """A model name, alias or 'model:adapter' -> its canonical form; None if unknown."""
        base, adapter = split_model(name)
        try:
            model = fleet.get(base).name
            if adapter is None:
                return model
            adapters.find(model, adapter)
        except ModelNotFound:  # AdapterNotFound included
            return None
        return f"{model}:{adapter}"

    default_model = fleet.default_model
    if settings.ingest.model is not None:
        resolved = resolve(settings.ingest.model)
        if resolved is None:
            raise SystemExit(
                f"--model {settings.ingest.model!r} (FLOTILLA_INGEST_MODEL) is neither a "
                f"model of the fleet ({', '.join(fleet.models)}) nor MODEL:ADAPTER of a "
                "registered adapter"
            )
        default_model = resolved
    return RecordRules(
        default_collection=settings.ingest.collection,
        default_model=default_model,
        max_text_bytes=settings.ingest.max_text_bytes,
        resolve_model=resolve,
        ocr_model=ocr_model(settings, fleet),
    )


def model_host(
    settings: Settings,
    fleet: Fleet | LiveFleet,
    queue: JobPuller,
    adapters: AdapterCatalog,
    loader: Loader | None = None,
    adapter_models: Collection[str] = (),
) -> ModelHost:
    """The fleet on this machine's device, pulling from ``queue`` once loaded."""
    return ModelHost(
        fleet,
        queue,
        options=[settings.requests, settings.ocr],
        device=settings.device,
        threads=settings.threads,
        loaders=None if loader is None else encoder_loaders(loader),
        adapters=adapters,
        tuned=serving_profiles(settings.tuned_file, settings.model_cache_dir),
        untuned=settings.untuned,
        adapter_models=adapter_models,
        # A loader of its own (the emulated runtime, a test's) is not what a tune times.
        tuning=local_tuning(settings) if loader is None else None,
        memory_budget_mb=settings.memory_budget_mb,
        backlog=queue.depth if isinstance(queue, InProcessQueue) else None,
    )


def local_tuning(settings: Settings) -> LocalTuning:
    """Where this machine's tuned profiles are kept, and the background tune's budget
    and priority."""
    tuner = functools.partial(tune_in_child, nice=settings.tune_nice)
    return LocalTuning(cache_file(settings.model_cache_dir), settings.tune_budget_s, tuner)


@dataclass(frozen=True, slots=True)
class LocalStack:
    """One machine's worker side: the fleet on this device behind an in-process queue,
    and the ingest core that writes what it embeds into the store."""

    fleet: LiveFleet  # shared by the host, the adapter catalog and the gateway
    adapters: AdapterCatalog
    queue: InProcessQueue
    host: ModelHost
    store: VectorStore
    core: IngestCore


def local_stack(
    settings: Settings,
    store: VectorStore | None = None,
    *,
    models: Sequence[str] | None = None,
    serving_url: str | None = None,
    loader: Loader | None = None,
    with_adapters: Collection[str] = (),
    kept: FleetStateFile | None = None,
    at_start: bool = False,
) -> LocalStack:
    """Built, not started: enter ``host`` and ``store`` to run it (``running_stack``).
    ``models`` (names, aliases or 'model:adapter') cuts the fleet to what a command
    uses, the first becoming the default; every model of the fleet when None. The base
    of a 'model:adapter', and each model of ``with_adapters``, runs on a runtime that
    takes adapters. ``kept``: the changes made while serving, applied at start;
    ``at_start``: every model loaded at start, on-demand ones too (a worker's)."""
    configured = configured_fleet(settings, kept)
    if at_start:
        configured = configured.loaded_at_start()
    if models is not None:
        configured = configured.only([split_model(name)[0] for name in models])
    fleet = LiveFleet(configured)
    wanted = [*with_adapters, *(split_model(n)[0] for n in models or () if split_model(n)[1])]
    adapter_models = {fleet.get(name).name for name in wanted}
    adapters = adapter_catalog(settings, fleet)
    queue = InProcessQueue()
    store = store or configured_store(settings, serving_url=serving_url)
    rules = record_rules(settings, fleet, adapters)  # a bad --model fails before loading
    embedder = QueueEmbedder(
        queue, bytes_per_token=settings.bytes_per_token, truncate=settings.requests.auto_truncate
    )
    reader = QueueReader(
        queue, bytes_per_token=settings.bytes_per_token, max_pages=settings.ocr.max_pages
    )
    host = model_host(settings, fleet, queue, adapters, loader, adapter_models)
    core = IngestCore(embedder, store, rules, chunking=chunking(settings, host), reader=reader)
    return LocalStack(fleet, adapters, queue, host, store, core)


def chunking(settings: Settings, host: ModelHost) -> Chunking:
    """Passages counted with each loaded model's own tokenizer and document prompt."""
    ingest = settings.ingest
    return Chunking(
        model_windows(LoadedEncoders(host.engines)),
        enabled=ingest.chunking,
        max_tokens=ingest.chunk_max_tokens,
        overlap_tokens=ingest.chunk_overlap_tokens,
    )


class Stopped(Exception):
    """A stop signal came while the models were still loading."""


@contextlib.asynccontextmanager
async def running_stack(
    settings: Settings,
    stop: asyncio.Event | None = None,
    *,
    store: VectorStore | None = None,
    models: Sequence[str] | None = None,
    claim: Sequence[str] = (),
    with_adapters: Collection[str] = (),
) -> AsyncIterator[LocalStack]:
    """A local stack with its models loaded and its worker pulling, writing to the
    configured store (or to ``store``, which it then closes). The collections in
    ``claim`` are opened before any model loads, so one that another process owns
    fails the command at once (``ShardLocked``). Raises ``Stopped`` if ``stop`` is set
    before the models are loaded."""
    stack = local_stack(settings, store, models=models, with_adapters=with_adapters)
    async with stack.store:
        await claim_collections(stack, claim)
        async with stack.host:
            if not await unless_stopped(stack.host.wait_ready(), stop or asyncio.Event()):
                raise Stopped
            if set(stack.host.failed) == set(stack.fleet.models):
                raise SystemExit(f"no model could be loaded: {stack.host.failed}")
            yield stack


async def claim_collections(stack: LocalStack, collections: Sequence[str]) -> None:
    """Open each collection of the entered ``stack.store`` now, so one of the embedded
    store that another process owns fails the command at once (``ShardLocked``, 409)."""
    for collection in collections:
        with contextlib.suppress(CollectionNotFound):  # created on its first write
            await stack.core.backoff.run(
                f"opening collection {collection}", stack.store.describe, collection
            )


def kafka_ingest(settings: Settings, core: IngestCore) -> IngestSupervisor | None:
    """Supervised ingest of --topic into ``core`` when --kafka and --topic are set: a
    failed run (a missing topic included) restarts with backoff while the process
    serves, and its state is the ``IngestHealth`` of /ready and /metrics."""
    if not (settings.ingest.bootstrap and settings.ingest.topic):
        return None
    return IngestSupervisor(kafka_source(settings, core), store=core.store_watch)


def kafka_source(settings: Settings, core: IngestCore) -> KafkaSource:
    """The consumer of --topic feeding ``core``; needs --kafka and --topic."""
    ingest = settings.ingest
    if not (ingest.bootstrap and ingest.topic):
        raise SystemExit("ingesting from Kafka needs --kafka BOOTSTRAP and --topic TOPIC")
    return KafkaSource(
        core,
        bootstrap=ingest.bootstrap,
        topic=ingest.topic,
        group=ingest.group,
        max_records=ingest.max_records,
        dlq_create=ingest.dlq_create,
        security=settings.kafka_security,
    )


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    quiet_repeats()  # the Kafka client's retries, once per half minute


def configure_tracing(settings: Settings, service: str) -> None:
    """Spans of this process (``service``) to --otlp-endpoint, when set; without the SDK
    installed, the command ends saying what to install."""
    from flotilla import tracing

    try:
        tracing.start(settings.otlp_endpoint, service)
    except tracing.TracingUnavailable as exc:
        raise SystemExit(f"error: {exc.message}") from None


def run_http(app: FastAPI, settings: Settings) -> None:
    """Serve ``app`` until SIGINT/SIGTERM; in-flight requests get 10 s to finish, stalled
    headers are dropped after --header-timeout-s (``flotilla.http_server``)."""
    server = uvicorn.Server(server_config(app, settings))
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:  # as uvicorn.run: the port was taken, the lifespan failed
        raise SystemExit(3)
