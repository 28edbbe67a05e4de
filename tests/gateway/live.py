"""The gateway behind the real HTTP server: uvicorn configured as `flotilla serve` does it
(``flotilla.http_server``), in a thread with its own event loop, serving the fake models
of ``tests.gateway.conftest``. For what only a real server shows: sockets that stall or
leave, timeouts, and the schema fuzzer's requests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from embedder.core.adapters import AdapterCatalog
from embedder.core.fleet import Fleet
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.kind import Loader as RuntimeLoader
from embedder.tasks.registry import encoder_loaders
from flotilla.http_server import server_config
from flotilla.settings import Settings
from flotilla.wiring import gateway_config, record_rules
from gateway.app import create_app
from ingest.embedding import QueueEmbedder
from ingest.pipeline import IngestCore
from ingest.store import VectorStore
from tests.gateway.conftest import Loader, fake_fleet_with_reranker


@dataclass(frozen=True)
class Live:
    host: str
    port: int
    app: FastAPI
    models: ModelHost

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=10)


@contextlib.contextmanager
def live_server(
    settings: Settings | None = None,
    *,
    fleet: Fleet | None = None,
    loader: RuntimeLoader | None = None,
    store: VectorStore | None = None,
    documents: bool = False,
    prepare: Callable[[ModelHost], Awaitable[None]] | None = None,
) -> Iterator[Live]:
    """``documents``: the documents routes too, writing into ``store`` through an ingest
    core as `serve` wires it; ``prepare`` runs on the server's loop once the models are
    loaded (to fill ``store``)."""
    settings = settings or Settings()
    fleet = fleet or fake_fleet_with_reranker("alpha", "beta")
    queue = InProcessQueue()
    host = ModelHost(
        fleet,
        queue,
        options=[settings.requests, settings.ocr],
        device="cpu",
        loaders=encoder_loaders(loader or Loader()),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(host)
            if store is not None:
                await stack.enter_async_context(store)
            await host.wait_ready()
            if prepare is not None:
                await prepare(host)
            yield

    core = None
    if documents:
        assert store is not None
        rules = record_rules(settings, fleet, AdapterCatalog(fleet))
        core = IngestCore(QueueEmbedder(queue), store, rules)
    app = create_app(
        gateway_config(settings), fleet, queue, host, lifespan=lifespan, store=store, ingest=core
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None: uvicorn's records reach the root logger (and pytest's caplog).
    server = uvicorn.Server(server_config(app, settings, log_config=None, port=port))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the live server did not start")
            time.sleep(0.02)
        yield Live("127.0.0.1", port, app, host)
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()
