"""`flotilla serve`: one process with the gateway, the in-process queue and a worker
on this device, the vector store for search, and, when --kafka and --topic are set,
Kafka ingestion feeding the same worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from embedder.errors import FlotillaError
from flotilla import wiring
from flotilla.settings import Settings
from gateway.app import create_app

log = logging.getLogger(__name__)


def build_app(settings: Settings) -> FastAPI:
    stack = wiring.local_stack(settings, serving_url=wiring.server_url(settings))
    host = stack.host
    ingesting = bool(settings.kafka and settings.topic)
    source = wiring.kafka_source(settings, stack.core) if ingesting else None

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
        async with host, stack.store:
            starting = asyncio.create_task(ingest_when_ready(), name="ingest-start")
            try:
                yield
            finally:
                starting.cancel()
                if source is not None:
                    await source.stop()  # drains the chunk in flight and commits

    app = create_app(
        wiring.gateway_config(settings),
        stack.fleet,
        stack.queue,
        host,
        lifespan=lifespan,
        store=stack.store,
        adapters=stack.adapters,
        ingest=stack.core,
    )
    app.state.host = host
    return app


def serve(settings: Settings) -> None:
    wiring.configure_logging(settings)
    wiring.run_http(build_app(settings), settings)
