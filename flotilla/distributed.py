"""Wiring for many machines: `flotilla gateway` (HTTP in front of the shared work queue,
no models) and `flotilla worker` (the fleet on this device, pulling from that queue);
``flotilla.transports`` makes the queue's halves (JetStream).

The gateway is torch-free; a worker imports torch only when its models load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import FastAPI

from embedder.residency.placement import Placement
from embedder.tasks.kind import Loader
from flotilla import wiring
from flotilla.settings import Settings
from flotilla.signals import stop_event, unless_stopped
from flotilla.transports import FleetView, Heartbeat, Puller, reply_topic, transport
from flotilla.worker_http import WorkerHttp
from flotilla.worker_ingest import WorkerIngest
from gateway.app import create_app

if TYPE_CHECKING:
    from embedder.core.fleet import Fleet
    from embedder.host import ModelHost

log = logging.getLogger(__name__)

# How long a stopping worker waits for the jobs it holds; what is left is handed back to
# the other workers. Orchestrators wait longer than this before they SIGKILL (k8s: 30 s).
DRAIN_S = 10.0


__all__ = ["build_gateway_app", "reply_topic", "run_worker", "serve_gateway", "serve_worker"]


def build_gateway_app(settings: Settings) -> FastAPI:
    queue = transport(settings)
    fleet = wiring.configured_fleet(settings)
    submitter = queue.submitter(settings)
    status = queue.fleet_status(settings)
    # Search needs a store every process can reach: the Qdrant server, not the embedded one.
    store = wiring.configured_store(settings) if settings.store == "qdrant" else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for part in (submitter, status):
                await part.start()
                stack.push_async_callback(part.stop)
            if store is not None:
                await stack.enter_async_context(store)
            log.info("gateway: requests over %s, replies on %s", queue.name,
                     reply_topic(settings))  # fmt: skip
            yield

    app = create_app(
        wiring.gateway_config(settings),
        fleet,
        submitter,
        status,
        lifespan=lifespan,
        store=store,
        adapters=wiring.adapter_catalog(settings, fleet),
    )
    app.state.submitter = submitter
    app.state.fleet_status = status
    return app


def serve_gateway(settings: Settings) -> None:
    wiring.configure_logging(settings)
    wiring.configure_tracing(settings, "flotilla-gateway")
    wiring.run_http(build_gateway_app(settings), settings)


async def run_worker(
    settings: Settings, stop: asyncio.Event | None = None, loader: Loader | None = None
) -> None:
    """Load the fleet's models loaded at start, then pull until ``stop`` (SIGINT/SIGTERM
    when not given), loading and evicting its on-demand models as the queue asks
    (``embedder.residency.placement``); then finish the jobs in hand and hand back the
    rest. With --topic, also ingest this worker's share of the topic, online requests
    first (``flotilla.worker_ingest``)."""
    queue = transport(settings)
    fleet = wiring.configured_fleet(settings)
    if settings.ingest.topic:
        # Ingest's jobs come without a request, and its chunks wait in this worker's own
        # queue, not the shared one placement reads: it hosts its whole fleet.
        fleet = fleet.loaded_at_start()
    worker_id = f"{socket.gethostname()}-{os.getpid()}"
    puller = queue.puller(settings, worker_id)
    bulk = WorkerIngest(settings, puller, loader) if settings.ingest.topic else None
    host = (
        bulk.host
        if bulk is not None
        else wiring.model_host(
            settings, fleet, puller, wiring.adapter_catalog(settings, fleet), loader
        )
    )
    heartbeat = queue.heartbeat(settings, worker_id, list(fleet.models), host, host.hostable)
    peers = queue.fleet_status(settings)
    placement = _placement(settings, fleet, host, puller, peers, heartbeat, worker_id)
    if stop is None:
        stop = stop_event()
    serving = False
    http = WorkerHttp(
        settings.host,
        settings.worker_port,
        lambda: serving and not stop.is_set(),
        ingest=bulk.ingest if bulk is not None else None,
    )
    try:
        if settings.worker_port:
            await http.start()
        if bulk is not None:
            await bulk.open()
        await host.start()
        loaded = await unless_stopped(host.wait_ready(), stop)
        if not loaded:
            return
        if not host.served and not placement.models:
            raise SystemExit(f"no model could be loaded: {host.failed}")
        # Fetch only now: requests taken by a worker still loading would wait until it
        # is done. A broker not reachable yet is waited for, and a stop meanwhile obeyed.
        if not await unless_stopped(_join(puller, bulk, heartbeat, peers, placement), stop):
            return
        serving = True
        log.info("worker: serving %s over %s", sorted(host.served), queue.name)
        await stop.wait()
        log.info("worker: stopping; finishing the jobs in hand")
        await placement.stop()
        await heartbeat.stop()
        abandoned, _ = await asyncio.gather(
            puller.drain(DRAIN_S), bulk.stop() if bulk is not None else asyncio.sleep(0)
        )
        if abandoned:
            log.warning("worker: %d jobs unfinished after %.0f s go back", abandoned, DRAIN_S)
    finally:
        await placement.stop()
        await peers.stop()
        await http.stop()
        await heartbeat.stop()
        if bulk is not None:
            await bulk.stop()  # before the host: its chunk in flight needs the worker
        await host.stop()
        if bulk is not None:
            await bulk.close()
        await puller.stop()


def _placement(
    settings: Settings,
    fleet: Fleet,
    host: ModelHost,
    puller: Puller,
    peers: FleetView,
    heartbeat: Heartbeat,
    worker_id: str,
) -> Placement:
    """The loop that loads this worker's on-demand models for the shared queue's work and
    evicts the idle ones; it reads the other workers' heartbeats through ``peers``."""
    on_demand = [name for name, spec in fleet.models.items() if spec.load == "on_demand"]
    return Placement(
        host.residents,
        on_demand,
        waiting=puller.waiting,
        peers=lambda: peers.others(worker_id),
        in_hand=host.in_hand,
        taken_at=puller.taken_at,
        announce=heartbeat.announce,
        idle_evict_s=settings.idle_evict_s,
    )


async def _join(
    puller: Puller,
    bulk: WorkerIngest | None,
    heartbeat: Heartbeat,
    peers: FleetView,
    placement: Placement,
) -> None:
    """The worker's side of the queue, in order: it pulls, then ingests, then says so;
    then it watches the others' heartbeats and places its on-demand models."""
    await puller.start()
    if bulk is not None:
        await bulk.start()
    await heartbeat.start()
    if placement.models:
        await peers.start()
        await placement.start()


def serve_worker(settings: Settings) -> None:
    wiring.configure_logging(settings)
    wiring.configure_tracing(settings, "flotilla-worker")
    asyncio.run(run_worker(settings))
