"""Wiring for one process: gateway + in-process queue + a worker on this device."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI

from embedder.codecs import RequestLimits
from embedder.fleet import load_fleet
from embedder.host import ModelHost
from embedder.workqueue import InProcessQueue
from flotilla.settings import Settings
from gateway.app import create_app


def build_app(settings: Settings) -> FastAPI:
    fleet = load_fleet(settings.fleet)
    queue = InProcessQueue()
    host = ModelHost(
        fleet,
        queue,
        RequestLimits(
            max_inputs=settings.max_inputs_per_request, auto_truncate=settings.auto_truncate
        ),
        device=settings.device,
        threads=settings.threads,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with host:
            yield

    app = create_app(settings, fleet, queue, host, lifespan=lifespan)
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
