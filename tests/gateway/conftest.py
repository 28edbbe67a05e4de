"""Fixtures for the gateway: the app wired to an in-process queue and a ModelHost of fakes,
driven in-process through httpx's ASGI transport; and, for slow tests, the real server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from numpy.typing import NDArray

from embedder.core.fleet import DeviceKind, Fleet, ModelSpec
from embedder.core.jobs import Job, JobResult, Task
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.runtimes import Encoded
from embedder.tasks.fleet import parse_fleet
from embedder.tasks.kind import Loader as RuntimeLoader
from embedder.tasks.registry import encoder_loaders
from flotilla.settings import Settings
from flotilla.wiring import gateway_config
from gateway.app import create_app
from tests.fakes import FakeLoader, FakeRuntime
from tests.ready import wait_ready

FAKE_MAX_TOKENS = 64


def fake_fleet_with_reranker(*embedders: str, reranker: str = "judge") -> Fleet:
    """Embedding models plus one cross-encoder reranker; each profile keeps batches small
    and waits 1 ms for company, so a test sees batching without waiting for it."""
    profile = {"cpu": {"max_batch_tokens": 512, "max_batch_requests": 16, "max_wait_ms": 1}}
    models: dict[str, dict[str, Any]] = {
        name: {
            "source": {"path": str(Path(__file__).parent)},
            "max_tokens": FAKE_MAX_TOKENS,
            "profiles": profile,
        }
        for name in embedders
    }
    models[embedders[0]]["aliases"] = [f"org/{embedders[0]}"]
    models[reranker] = {
        "source": {"path": str(Path(__file__).parent)},
        "task": "rerank",
        "max_tokens": FAKE_MAX_TOKENS,
        "profiles": profile,
    }
    return parse_fleet({"models": models})


class GatedRuntime(FakeRuntime):
    """A FakeRuntime whose forward pass waits for ``gate`` (when set up), so a test can hold
    the worker busy at a known point. Waits are bounded: a broken test fails, never hangs."""

    def __init__(self, spec: ModelSpec, gate: threading.Event | None, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.gate = gate
        self.entered = threading.Event()

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> NDArray[np.float32]:
        self.entered.set()
        if self.gate is not None and not self.gate.wait(timeout=10):
            raise RuntimeError("test gate never opened")
        return super().forward(encoded, adapters)


class Loader(FakeLoader):
    """tests.fakes.FakeLoader, plus: cross-encoder fakes for rerank models, a gate that
    holds loading (``load_gate``) or forward passes (``forward_gate``), and load failures
    for the models named in ``fail``."""

    def __init__(
        self,
        *,
        load_gate: threading.Event | None = None,
        forward_gate: threading.Event | None = None,
        fail: frozenset[str] = frozenset(),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.load_gate = load_gate
        self.forward_gate = forward_gate
        self.fail = fail
        self.runtimes: dict[str, GatedRuntime] = {}  # type: ignore[assignment]

    def __call__(self, spec: ModelSpec, device: DeviceKind, threads: int) -> GatedRuntime:
        if self.load_gate is not None and not self.load_gate.wait(timeout=10):
            raise RuntimeError("test load gate never opened")
        if spec.name in self.fail:
            raise OSError(f"weights of {spec.name} are corrupt")
        runtime = GatedRuntime(
            spec, self.forward_gate, cross=spec.task == Task.RERANK, **self.kwargs
        )
        self.runtimes[spec.name] = runtime
        return runtime


class RecordingQueue(InProcessQueue):
    """The real in-process queue, remembering every job put and its future."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[tuple[Job, asyncio.Future[JobResult]]] = []

    async def put(self, job: Job) -> asyncio.Future[JobResult]:
        future = await super().put(job)
        self.jobs.append((job, future))
        return future


@dataclass
class Stack:
    """One gateway over one ModelHost, and an httpx client talking to it in-process."""

    app: FastAPI
    client: httpx.AsyncClient
    host: ModelHost
    queue: RecordingQueue
    loader: RuntimeLoader
    settings: Settings
    fleet: Fleet

    def runtime(self, model: str) -> GatedRuntime:
        """The fake behind ``model`` (stacks built with a ``Loader``)."""
        assert isinstance(self.loader, Loader)
        return self.loader.runtimes[model]


StackFactory = Callable[..., contextlib.AbstractAsyncContextManager[Stack]]


@contextlib.asynccontextmanager
async def running_stack(
    settings: Settings | None = None,
    fleet: Fleet | None = None,
    loader: RuntimeLoader | None = None,
    *,
    wait_ready: bool = True,
) -> AsyncIterator[Stack]:
    settings = settings or Settings()
    fleet = fleet or fake_fleet_with_reranker("alpha", "beta", "gamma")
    loader = loader or Loader()
    queue = RecordingQueue()
    # As flotilla.serve.build_app wires it, with fakes in place of torch.
    host = ModelHost(
        fleet,
        queue,
        options=[settings.requests],
        device="cpu",
        loaders=encoder_loaders(loader),
    )
    app = create_app(gateway_config(settings), fleet, queue, host)
    transport = httpx.ASGITransport(app=app)
    async with (
        host,
        httpx.AsyncClient(transport=transport, base_url="http://flotilla.test") as client,
    ):
        try:
            if wait_ready:
                await asyncio.wait_for(host.wait_ready(), 10)
            yield Stack(app, client, host, queue, loader, settings, fleet)
        finally:
            # Never leave a loader or forward thread parked on a gate after the test.
            for name in ("load_gate", "forward_gate"):
                if (gate := getattr(loader, name, None)) is not None:
                    gate.set()


@pytest.fixture
def make_stack() -> StackFactory:
    return running_stack


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack() as s:
        yield s


# -- real models (slow tests) -----------------------------------------------------


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """No model hub while loading local weights, and nothing left set afterwards: the
    variable, and huggingface_hub's constant, which it reads once at import."""
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@dataclass(frozen=True)
class RealServer:
    url: str
    log: Path
    model_cache: Path  # where the server imported the fleet's imported models


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Launched:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    model_cache: Path


@pytest.fixture(scope="session")
def launched_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Launched]:
    """`flotilla serve` started, not yet ready: a test module can load its own reference
    model meanwhile."""
    folder = tmp_path_factory.mktemp("real-server")
    port = _free_port()
    log = folder / "server.log"
    model_cache = folder / "models"  # imports go here, not into the user's cache
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "FLOTILLA_MODEL_CACHE_DIR": str(model_cache)}
    command = [sys.executable, "-m", "flotilla", "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port)]  # the bundled fleet, as `make run` serves it
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield _Launched(proc, f"http://127.0.0.1:{port}", log, model_cache)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def real_server(launched_server: _Launched) -> RealServer:
    """The real server, once /ready says every model is loaded (up to 600 s: on a 2-core
    machine alone the bundled fleet loads in about 90 s; with a training run on one of
    the cores, calibrating a device without a tuned profile took 344 s, the generator's
    dtype probe 195 s of it)."""
    proc, url, log = launched_server.proc, launched_server.url, launched_server.log
    wait_ready(url, lambda: None if proc.poll() is None else log.read_text(), timeout_s=600)
    return RealServer(url, log, launched_server.model_cache)
