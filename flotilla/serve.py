"""Wiring for one process: gateway + in-process queue + a worker on this device, the
vector store for search, and, when --kafka and --topic are set, Kafka ingestion feeding
the same worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI

from embedder.errors import FlotillaError
from embedder.fleet import load_fleet
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from flotilla.ingest import adapter_catalog, configured_store, record_rules, request_limits
from flotilla.settings import Settings
from gateway.app import create_app
from ingest.embedding import QueueEmbedder
from ingest.kafka_source import KafkaSource
from ingest.pipeline import IngestCore

log = logging.getLogger(__name__)


def build_app(settings: Settings) -> FastAPI:
    fleet = load_fleet(settings.fleet).with_model_cache(settings.model_cache_dir)
    queue = InProcessQueue()
    adapters = adapter_catalog(settings, fleet)
    host = ModelHost(
        fleet,
        queue,
        request_limits(settings),
        device=settings.device,
        threads=settings.threads,
        adapters=adapters,
    )
    store = configured_store(settings)
    source: KafkaSource | None = None
    if settings.kafka and settings.topic:
        core = IngestCore(
            QueueEmbedder(
                queue, bytes_per_token=settings.bytes_per_token, truncate=settings.auto_truncate
            ),
            store,
            record_rules(settings, fleet, adapters),
        )
        source = KafkaSource(
            core,
            bootstrap=settings.kafka,
            topic=settings.topic,
            group=settings.group,
            max_records=settings.ingest_max_records,
        )

    async def ingest_when_ready() -> None:
        await host.wait_ready()
        if source is not None:
            try:
                await source.start()
            except FlotillaError as exc:  # the service still embeds; say why nothing ingests
                log.error("not ingesting: %s", exc.message)
                return
            log.info("ingesting %s into %s", settings.topic, settings.collection)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with host, store:
            starting = asyncio.create_task(ingest_when_ready(), name="ingest-start")
            try:
                yield
            finally:
                starting.cancel()
                if source is not None:
                    await source.stop()  # drains the chunk in flight and commits

    app = create_app(
        settings, fleet, queue, host, lifespan=lifespan, store=store, adapters=adapters
    )
    app.state.host = host
    return app


def serve(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        build_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=10,
    )
