"""Requests for an adapter whose graph the runtime is still building: the worker holds
them (base requests go on meanwhile) and runs them once the build ends; a failed build
reaches them as its error, an expired one as a 504; without a pipeline they get a
retriable 503."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from embedder.core.adapters import AdapterCatalog, ResidentAdapters
from embedder.core.errors import AdapterBuilding, AdapterInvalid, DeadlineExceeded
from embedder.core.jobs import ApiShape, Job, JobResult
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.batching import BatchLimits
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.execute import LoadedModel, run_batch
from embedder.tasks.embed.worker import Worker
from tests.embedder.core.test_adapters import adapter_folder, fleet_with
from tests.fakes import FakeRuntime

WAIT_S = 5.0
LIMITS = BatchLimits(max_tokens=1000, max_requests=16, max_wait_s=0.002, mix_adapters=True)


def loaded(tmp_path: Path) -> tuple[FakeRuntime, LoadedModel]:
    fleet = fleet_with(tmp_path, {"a": adapter_folder(tmp_path / "a")})
    spec = fleet.get("model")
    fake = FakeRuntime(spec)
    resident = ResidentAdapters(2, fake.load_adapter, fake.unload_adapter)
    return fake, LoadedModel(spec, fake, LIMITS, AdapterCatalog(fleet), resident)


def job(id: str, adapter: str | None, text: str, timeout_s: float = 30.0) -> Job:
    now = time.time()
    body = json.dumps({"input": [text], "model": "model"}).encode()
    return Job(
        id=id,
        model="model",
        shape=ApiShape.OPENAI_EMBEDDINGS,
        body=body,
        est_tokens=5,
        deadline=now + timeout_s,
        enqueued_at=now,
        adapter=adapter,
    )


def vector(result: JobResult) -> np.ndarray:  # type: ignore[type-arg]
    return np.asarray(json.loads(result.body)["data"][0]["embedding"], dtype=np.float32)


async def serving(model: LoadedModel) -> tuple[InProcessQueue, Worker]:
    queue = InProcessQueue()
    worker = Worker(queue, {"model": model}, RequestLimits())
    await worker.start()
    return queue, worker


async def test_adapter_requests_wait_for_the_build_while_base_requests_run(
    tmp_path: Path,
) -> None:
    fake, model = loaded(tmp_path)
    build: Future[None] = Future()
    fake.building["a"] = build
    queue, worker = await serving(model)
    try:
        adapted = await queue.put(job("j1", "a", "for a"))
        base = await queue.put(job("j2", None, "base text"))
        result = await asyncio.wait_for(base, WAIT_S)
        assert isinstance(result, JobResult)  # the base model never waits for the build
        await asyncio.sleep(0.1)
        assert not adapted.done()  # held, not failed
        build.set_result(None)
        result = await asyncio.wait_for(adapted, WAIT_S)
        assert isinstance(result, JobResult)
        np.testing.assert_allclose(
            vector(result), fake.expected_vector("for a", adapter="a"), atol=1e-5
        )
    finally:
        await worker.stop()


async def test_a_failed_build_reaches_the_waiting_requests(tmp_path: Path) -> None:
    fake, model = loaded(tmp_path)
    build: Future[None] = Future()
    fake.building["a"] = build
    queue, worker = await serving(model)
    try:
        adapted = await queue.put(job("j1", "a", "for a"))
        await asyncio.sleep(0.1)
        build.set_exception(AdapterInvalid("adapter 'a' does not fit model 'model'"))
        with pytest.raises(AdapterInvalid, match="does not fit"):
            await asyncio.wait_for(adapted, WAIT_S)
        base = await queue.put(job("j2", None, "base text"))
        assert isinstance(await asyncio.wait_for(base, WAIT_S), JobResult)
    finally:
        await worker.stop()


async def test_a_request_whose_deadline_passes_during_the_build_gets_a_504(
    tmp_path: Path,
) -> None:
    fake, model = loaded(tmp_path)
    fake.building["a"] = Future()  # never ends
    queue, worker = await serving(model)
    try:
        adapted = await queue.put(job("j1", "a", "for a", timeout_s=0.3))
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(adapted, WAIT_S)
    finally:
        await worker.stop()


def test_without_a_pipeline_the_request_gets_a_retriable_503(tmp_path: Path) -> None:
    fake, model = loaded(tmp_path)
    fake.building["a"] = Future()
    report = run_batch(
        [job("j1", "a", "for a"), job("j2", None, "base")], model, RequestLimits(), 0
    )
    outcomes = {j.id: outcome for j, outcome in report.outcomes}
    error = outcomes["j1"]
    assert isinstance(error, AdapterBuilding)
    assert error.http_status == 503 and error.retriable and "Retry-After" in error.headers
    assert isinstance(outcomes["j2"], JobResult)
