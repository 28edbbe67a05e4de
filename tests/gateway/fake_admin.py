"""A stand-in for the model host of ``flotilla serve`` behind the admin API: a FleetAdmin
and ModelStates over a LiveFleet, with a worker of its own that answers every job of the
in-process queue once ``gate`` is open (each answer names its model). Removing a model
takes it out of the fleet at once and returns once its queued and running jobs are done,
as the FleetAdmin protocol asks."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI

from embedder.core.fleet import Fleet, FleetAdmin, LiveFleet, ModelSpec
from embedder.core.jobs import Job, JobResult, ModelState, Timings
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.fleet import parse_fleet
from gateway.app import create_app
from gateway.config import GatewayConfig, GatewayLimits

CLIENT_KEY = "client-key"
ADMIN_KEY = "admin-key"
SOURCE = {"path": "/models/weights"}  # never loaded: the fake answers without weights


def two_models() -> Fleet:
    return parse_fleet(
        {
            "models": {
                "alpha": {"source": SOURCE, "aliases": ["org/alpha"]},
                "judge": {"source": SOURCE, "task": "rerank", "load": "on_demand"},
            }
        }
    )


class FakeFleetHost:
    def __init__(self, fleet: LiveFleet, queue: InProcessQueue) -> None:
        self.fleet = fleet
        self.queue = queue
        self.gate = asyncio.Event()
        self.gate.set()
        self.running: Counter[str] = Counter()  # pulled, not yet answered
        self.pulled: list[Job] = []
        self.draining: set[str] = set()  # removed, their jobs still served
        self.removals_started: list[str] = []
        self._idle = asyncio.Condition()
        self._answering: set[asyncio.Task[None]] = set()

    # -- ModelStates ---------------------------------------------------------------

    def state(self, model: str) -> ModelState:
        return "ready"

    def describe(self, model: str) -> dict[str, object]:
        return {"runtime": "fake"}

    # -- FleetAdmin ----------------------------------------------------------------

    async def add_model(self, spec: ModelSpec) -> None:
        self.fleet.add(spec)

    async def remove_model(self, name: str) -> None:
        self.fleet.remove(name)
        self.draining.add(name)
        self.removals_started.append(name)
        try:
            async with self._idle:
                await self._idle.wait_for(
                    lambda: not self.queue.depth()[name] and not self.running[name]
                )
        finally:
            self.draining.discard(name)

    # -- the worker ----------------------------------------------------------------

    async def work(self) -> None:
        while True:
            models = [*self.fleet.models, *self.draining]
            jobs = await self.queue.pull(models, max_tokens=1 << 30, timeout_s=0.02)
            for job in jobs:
                self.running[job.model] += 1
                self.pulled.append(job)
                answering = asyncio.create_task(self._answer(job))
                self._answering.add(answering)  # held until done: a task is weakly referenced
                answering.add_done_callback(self._answering.discard)

    async def _answer(self, job: Job) -> None:
        await self.gate.wait()
        body = json.dumps({"model": job.model}).encode()
        await self.queue.complete(job.id, JobResult(body, 1, Timings(0.0, 0.0)))
        async with self._idle:
            self.running[job.model] -= 1
            self._idle.notify_all()

    @contextlib.asynccontextmanager
    async def running_worker(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self.work())
        try:
            yield
        finally:
            for running in (task, *self._answering):
                running.cancel()
            await asyncio.gather(task, *self._answering, return_exceptions=True)


def admin_app(
    *,
    admin_keys: tuple[str, ...] = (ADMIN_KEY,),
    api_keys: tuple[str, ...] = (CLIENT_KEY,),
    wrap: Callable[[FakeFleetHost], FleetAdmin] = lambda host: host,
) -> tuple[FastAPI, FakeFleetHost]:
    """The gateway app over a fake host of ``two_models``, with the admin API over
    ``wrap(host)`` (the host itself, unless a test wraps it)."""
    fleet = LiveFleet(two_models())
    queue = InProcessQueue()
    host = FakeFleetHost(fleet, queue)
    limits = GatewayLimits(api_keys=api_keys, admin_keys=admin_keys)
    config = GatewayConfig("test", bytes_per_token=4.0, max_documents_per_request=8, limits=limits)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with host.running_worker():
            yield

    app = create_app(config, fleet, queue, host, lifespan=lifespan, admin=wrap(host))
    return app, host
