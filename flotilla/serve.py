"""`flotilla serve`: one process with the gateway, the in-process queue and a worker
on this device, the vector store for search, and, when --kafka and --topic are set,
Kafka ingestion feeding the same worker: supervised, so a failed ingest loop restarts
with backoff while the API keeps serving, and /ready and /metrics say so. With
--admin-keys, models are added and removed while it serves (``gateway.admin``), and with
--fleet-state those changes are kept for the next start (``flotilla.fleet_state``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from flotilla import wiring
from flotilla.fleet_state import FleetStateFile, KeptFleetChanges
from flotilla.settings import Settings
from gateway.app import create_app

log = logging.getLogger(__name__)


def build_app(settings: Settings) -> FastAPI:
    kept = None if settings.fleet_state is None else FleetStateFile(settings.fleet_state)
    stack = wiring.local_stack(settings, serving_url=wiring.server_url(settings), kept=kept)
    host = stack.host
    ingest = wiring.kafka_ingest(settings, stack.core)

    async def ingest_when_ready() -> None:
        await host.wait_ready()
        if ingest is not None:
            # Failures, a missing topic included, are retried with backoff: the service
            # still embeds, /ready says why nothing ingests, creating the topic heals it.
            await ingest.start()
            log.info("ingesting %s into %s", settings.ingest.topic, settings.ingest.collection)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with host, stack.store:
            starting = asyncio.create_task(ingest_when_ready(), name="ingest-start")
            try:
                yield
            finally:
                starting.cancel()
                if ingest is not None:
                    await ingest.stop()  # drains the chunk in flight and commits

    app = create_app(
        wiring.gateway_config(settings),
        stack.fleet,
        stack.queue,
        host,
        lifespan=lifespan,
        store=stack.store,
        adapters=stack.adapters,
        ingest=stack.core,
        ingest_health=ingest,
        admin=KeptFleetChanges(host, kept, wiring.imports_cached(settings)),
    )
    app.state.host = host
    return app


def serve(settings: Settings) -> None:
    wiring.configure_logging(settings)
    wiring.configure_tracing(settings, "flotilla-serve")
    wiring.run_http(build_app(settings), settings)
