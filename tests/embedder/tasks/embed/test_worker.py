"""The worker loop and the model host, end to end over the in-process queue with fake runtimes.

Jobs go in the way the gateway puts them (annotated, raw body, deadline) and the tests read
the encoded replies, so decoding, batching, the forward pass and delivery are all exercised.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

from embedder.core.errors import (
    DeadlineExceeded,
    FlotillaError,
    InferenceFailed,
    InvalidRequest,
    LimitExceeded,
)
from embedder.core.fleet import DeviceKind, ModelSpec
from embedder.core.jobs import ApiShape, Job, JobResult, TruncationSide
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.batching import BatchLimits
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.engine import LoadedEncoders
from embedder.tasks.embed.execute import LoadedModel
from embedder.tasks.embed.runtimes import Encoded
from embedder.tasks.embed.worker import Worker
from embedder.tasks.registry import encoder_loaders
from tests.fakes import FAIL_MARKER, FakeLoader, FakeRuntime, fake_fleet

OPENAI = ApiShape.OPENAI_EMBEDDINGS
TEI = ApiShape.TEI_EMBED
MAX_TOKENS = 64  # the fake models' input limit
WAIT_S = 5.0  # upper bound for anything a test awaits; a hang fails instead of stalling
FAST = BatchLimits(max_tokens=512, max_requests=16, max_wait_s=0.002)


class RecordingRuntime(FakeRuntime):
    """A FakeRuntime that remembers every text it was asked to tokenize and counts the
    forward passes that have returned."""

    def __init__(self, spec: ModelSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.seen: list[str] = []
        self.forwards_done = 0

    def tokenize(self, texts: Sequence[str], side: TruncationSide, prefix: str = "") -> Encoded:
        self.seen.extend(texts)
        return super().tokenize(texts, side, prefix)

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> np.ndarray[Any, Any]:
        try:
            return super().forward(encoded, adapters)
        finally:
            self.forwards_done += 1


def spec_of(name: str) -> ModelSpec:
    return fake_fleet(name, max_tokens=MAX_TOKENS).models[name]


def runtime_for(name: str, **kwargs: Any) -> RecordingRuntime:
    return RecordingRuntime(spec_of(name), **kwargs)


def worker_for(
    queue: InProcessQueue,
    runtimes: Sequence[FakeRuntime],
    limits: BatchLimits = FAST,
    request_limits: RequestLimits | None = None,
) -> Worker:
    models = {r.spec.name: LoadedModel(r.spec, r, limits) for r in runtimes}
    return Worker(queue, models, request_limits or RequestLimits())


class Client:
    """Puts jobs as the gateway does: annotated with an estimate and a deadline."""

    def __init__(self, queue: InProcessQueue) -> None:
        self.queue = queue
        self.sent = 0

    async def send(
        self,
        model: str,
        payload: dict[str, object] | bytes,
        *,
        shape: ApiShape = TEI,
        timeout_s: float = 30.0,
    ) -> tuple[Job, asyncio.Future[JobResult]]:
        self.sent += 1
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        now = time.time()
        job = Job(
            id=f"{model}-{self.sent:04d}",
            model=model,
            shape=shape,
            body=body,
            est_tokens=max(1, len(body) // 4),
            deadline=now + timeout_s,
            enqueued_at=now,
        )
        return job, await self.queue.put(job)

    async def embed(
        self, model: str, texts: list[str], *, shape: ApiShape = TEI, **fields: object
    ) -> asyncio.Future[JobResult]:
        key = "input" if shape is OPENAI else "inputs"
        _, future = await self.send(model, {key: texts, **fields}, shape=shape)
        return future


def vectors_of(result: JobResult, shape: ApiShape = TEI) -> np.ndarray[Any, Any]:
    out = json.loads(result.body)
    if shape is OPENAI:
        assert [d["index"] for d in out["data"]] == list(range(len(out["data"])))
        out = [d["embedding"] for d in out["data"]]
    return np.asarray(out, dtype=np.float32)


def expected(runtime: FakeRuntime, texts: Sequence[str]) -> np.ndarray[Any, Any]:
    return np.stack([runtime.expected_vector(t) for t in texts])


async def outcome(future: asyncio.Future[JobResult]) -> JobResult | FlotillaError:
    try:
        return await asyncio.wait_for(future, WAIT_S)
    except FlotillaError as exc:
        return exc


async def until(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    give_up = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.001)


# -- results ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    runtime: FakeRuntime
    texts: list[str]
    shape: ApiShape
    future: asyncio.Future[JobResult]


async def test_concurrent_requests_across_models_each_get_their_own_vectors() -> None:
    runtimes = [runtime_for(name) for name in ("alpha", "beta", "gamma")]
    queue = InProcessQueue()
    client = Client(queue)
    sent: list[Sent] = []
    async with worker_for(queue, runtimes):
        for wave in range(3):
            for i in range(30):
                runtime = runtimes[i % 3]
                # Distinct texts, so a reply delivered to the wrong request cannot match.
                texts = [f"wave {wave} request {i} text {k}" for k in range(1 + i % 3)]
                shape = OPENAI if i % 2 else TEI
                future = await client.embed(runtime.spec.name, texts, shape=shape)
                sent.append(Sent(runtime, texts, shape, future))
            await asyncio.sleep(0.003)  # later waves arrive while earlier ones run
        results = await asyncio.wait_for(asyncio.gather(*(s.future for s in sent)), WAIT_S)

    for request, result in zip(sent, results, strict=True):
        np.testing.assert_allclose(
            vectors_of(result, request.shape), expected(request.runtime, request.texts), atol=1e-6
        )
        assert result.prompt_tokens == sum(len(FakeRuntime.word_ids(t)) for t in request.texts)
    for runtime in runtimes:
        mine = [s.texts for s in sent if s.runtime is runtime]
        assert sum(runtime.forward_calls) == sum(len(texts) for texts in mine)
        # Fewer forwards than requests: requests shared batches.
        assert len(runtime.forward_calls) < len(mine)


async def test_openai_reply_has_the_fleet_model_name_and_usage() -> None:
    runtime = runtime_for("alpha")
    queue = InProcessQueue()
    async with worker_for(queue, [runtime]):
        future = await Client(queue).embed("alpha", ["one two"], shape=OPENAI)
        result = await asyncio.wait_for(future, WAIT_S)
    out = json.loads(result.body)
    assert out["model"] == "alpha"
    assert out["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    assert result.timings.queue_s >= 0.0
    assert result.timings.inference_s >= 0.0


# -- failures stay with the jobs they belong to ----------------------------------------


async def test_a_failing_batch_fails_every_job_in_it_and_the_worker_carries_on() -> None:
    runtime = runtime_for("alpha")
    queue = InProcessQueue()
    client = Client(queue)
    # Queued before the worker starts, so all three are pulled and batched together.
    doomed = [
        await client.embed("alpha", ["fine"]),
        await client.embed("alpha", [f"broken {FAIL_MARKER}"]),
        await client.embed("alpha", ["also fine"]),
    ]
    async with worker_for(queue, [runtime]):
        failures = [await outcome(f) for f in doomed]
        later = await outcome(await client.embed("alpha", ["after the failure"]))

    assert runtime.forward_calls[0] == 3  # one batch held all three
    for failure in failures:
        assert isinstance(failure, InferenceFailed)
        assert failure.http_status == 500
        assert failure.retriable
    assert isinstance(later, JobResult)
    np.testing.assert_allclose(
        vectors_of(later), expected(runtime, ["after the failure"]), atol=1e-6
    )


async def test_a_job_with_bad_json_fails_alone() -> None:
    runtime = runtime_for("alpha")
    queue = InProcessQueue()
    client = Client(queue)
    first = await client.embed("alpha", ["first"])
    _, bad = await client.send("alpha", b'{"inputs": ["unterminated')
    last = await client.embed("alpha", ["last"])
    async with worker_for(queue, [runtime]):
        outcomes = [await outcome(f) for f in (first, bad, last)]

    assert isinstance(outcomes[1], InvalidRequest)
    assert outcomes[1].http_status == 422
    for texts, result in ((["first"], outcomes[0]), (["last"], outcomes[2])):
        assert isinstance(result, JobResult)
        np.testing.assert_allclose(vectors_of(result), expected(runtime, texts), atol=1e-6)
    assert runtime.forward_calls == [2]  # the good two still shared their forward


async def test_an_expired_job_gets_deadline_exceeded_without_running() -> None:
    runtime = runtime_for("alpha")
    queue = InProcessQueue()
    client = Client(queue)
    _, late = await client.send("alpha", {"inputs": ["too late"]}, timeout_s=-0.001)
    on_time = await client.embed("alpha", ["on time"])
    async with worker_for(queue, [runtime]):
        late_outcome = await outcome(late)
        on_time_outcome = await outcome(on_time)

    assert isinstance(late_outcome, DeadlineExceeded)
    assert late_outcome.http_status == 504
    assert isinstance(on_time_outcome, JobResult)
    assert "too late" not in runtime.seen
    assert runtime.forward_calls == [1]


async def test_a_job_cancelled_while_queued_is_not_run() -> None:
    runtime = runtime_for("alpha")
    queue = InProcessQueue()
    client = Client(queue)
    kept = await client.embed("alpha", ["kept"])
    gone = await client.embed("alpha", ["gone"])
    gone.cancel()
    async with worker_for(queue, [runtime]):
        assert isinstance(await outcome(kept), JobResult)
    assert runtime.seen == ["kept"]


async def test_a_job_cancelled_after_the_worker_pulled_it_is_not_run() -> None:
    runtime = runtime_for("alpha")
    queue = InProcessQueue()
    client = Client(queue)
    # A long max_wait keeps the batch open, so the job sits in the worker's pending set.
    holding = BatchLimits(max_tokens=512, max_requests=3, max_wait_s=WAIT_S)
    async with worker_for(queue, [runtime], holding):
        gone = await client.embed("alpha", ["gone"])
        await until(lambda: queue.depth()["alpha"] == 0)
        gone.cancel()
        await asyncio.sleep(0)
        # Three more fill the batch by request count, so the worker forms it now.
        fillers = [await client.embed("alpha", [f"filler {i}"]) for i in range(3)]
        results = [await outcome(f) for f in fillers]

    assert all(isinstance(r, JobResult) for r in results)
    assert "gone" not in runtime.seen
    assert runtime.forward_calls == [3]


async def test_a_job_cancelled_after_its_batch_was_formed_is_not_run() -> None:
    # One request per batch and a slow forward: while the first runs, the next batches
    # are already formed and wait their turn.
    runtime = runtime_for("alpha", seconds_per_token=0.01)
    queue = InProcessQueue()
    client = Client(queue)
    futures = [await client.embed("alpha", [f"job {i}"]) for i in range(3)]
    one_at_a_time = BatchLimits(max_tokens=512, max_requests=1, max_wait_s=0.0)
    async with worker_for(queue, [runtime], one_at_a_time):
        await until(lambda: len(runtime.forward_calls) == 1 and queue.depth()["alpha"] == 0)
        futures[1].cancel()
        futures[2].cancel()
        first = await outcome(futures[0])
        after = await outcome(await client.embed("alpha", ["after"]))

    assert isinstance(first, JobResult)
    assert isinstance(after, JobResult)
    assert runtime.seen == ["job 0", "after"]


async def test_the_next_batch_is_formed_late_from_what_arrived_during_a_forward() -> None:
    # A slow forward, and no wait at all: a batch formed as soon as the device took the
    # last one would hold only the first arrival; formed as the device frees, it holds
    # every job that arrived meanwhile, and until then they stay in the shared queue.
    runtime = runtime_for("alpha", seconds_per_token=0.05)
    queue = InProcessQueue()
    client = Client(queue)
    no_wait = BatchLimits(max_tokens=512, max_requests=16, max_wait_s=0.0)
    async with worker_for(queue, [runtime], no_wait):
        for text in ("time the device", "and the host"):  # the pace needs timed batches
            assert isinstance(await outcome(await client.embed("alpha", [text])), JobResult)
        running = await client.embed("alpha", ["running"])
        await until(lambda: len(runtime.forward_calls) == 3)
        later = []
        for i in range(3):
            later.append(await client.embed("alpha", [f"later {i}"]))
            await asyncio.sleep(0.01)
        assert queue.depth()["alpha"] == 3  # not pulled while the device is busy
        results = [await outcome(f) for f in (running, *later)]

    assert all(isinstance(r, JobResult) for r in results)
    assert runtime.forward_calls == [1, 1, 1, 3]


# -- limits ----------------------------------------------------------------------------

LONG_TEXT = " ".join(f"word{i}" for i in range(80))  # 82 tokens with [CLS] and [SEP]


async def test_an_over_long_input_without_truncate_is_a_limit_error_naming_the_limit() -> None:
    runtime = runtime_for("alpha")
    queue = InProcessQueue()
    client = Client(queue)
    async with worker_for(queue, [runtime]):
        refused = await outcome(await client.embed("alpha", ["short", LONG_TEXT], truncate=False))
        short = await outcome(await client.embed("alpha", ["short"]))

    assert isinstance(refused, LimitExceeded)
    assert refused.http_status == 413
    assert "input 1 has 82 tokens" in refused.message
    assert f"limit of {MAX_TOKENS}" in refused.message
    assert '"truncate": true' in refused.message
    assert "FLOTILLA_AUTO_TRUNCATE" in refused.message
    assert isinstance(short, JobResult)


async def test_an_over_long_input_with_truncate_is_cut_on_the_asked_side() -> None:
    runtime = runtime_for("alpha")
    queue = InProcessQueue()
    client = Client(queue)
    async with worker_for(queue, [runtime]):
        right = await client.embed("alpha", [LONG_TEXT], truncate=True)
        left = await client.embed("alpha", [LONG_TEXT], truncate=True, truncation_direction="left")
        right_result, left_result = await asyncio.wait_for(asyncio.gather(right, left), WAIT_S)

    np.testing.assert_allclose(vectors_of(right_result), expected(runtime, [LONG_TEXT]), atol=1e-6)
    body = FakeRuntime.word_ids(LONG_TEXT)[1:-1]
    kept_tail = [101, *body[-(MAX_TOKENS - 2) :], 102]
    tail_vector = runtime.vector_of_ids(kept_tail)
    np.testing.assert_allclose(
        vectors_of(left_result)[0], tail_vector / np.linalg.norm(tail_vector), atol=1e-6
    )
    assert right_result.prompt_tokens == MAX_TOKENS


async def test_auto_truncate_covers_openai_requests() -> None:
    runtime = runtime_for("alpha")
    queue = InProcessQueue()
    async with worker_for(queue, [runtime], request_limits=RequestLimits(auto_truncate=True)):
        future = await Client(queue).embed("alpha", [LONG_TEXT], shape=OPENAI)
        result = await asyncio.wait_for(future, WAIT_S)
    np.testing.assert_allclose(
        vectors_of(result, OPENAI), expected(runtime, [LONG_TEXT]), atol=1e-6
    )


# -- fairness --------------------------------------------------------------------------


FLOOD_BACKLOG = 60  # model A jobs the flooding client keeps waiting in the queue


async def test_a_flood_of_one_model_does_not_starve_another() -> None:
    """One client keeps the queue full of model A jobs, so the worker always has A work
    queued and pending. A single model B request sent with the same timeout is still
    answered, while the flood runs, ahead of the A requests sent after it."""
    # Each forward sleeps per token, so A's backlog takes real time to clear.
    flood, single = runtime_for("flood", seconds_per_token=0.0002), runtime_for("single")
    queue = InProcessQueue()
    client = Client(queue)
    limits = BatchLimits(max_tokens=64, max_requests=4, max_wait_s=0.001)
    finished: list[str] = []
    stop_flooding = asyncio.Event()

    async def note_when_done(job: Job, future: asyncio.Future[JobResult]) -> None:
        await asyncio.wait_for(future, 4 * WAIT_S)
        finished.append(job.id)

    async def flood_client() -> None:
        waiting: list[asyncio.Task[None]] = []
        while not stop_flooding.is_set():
            while queue.depth()["flood"] < FLOOD_BACKLOG:
                job, future = await client.send("flood", {"inputs": [f"bulk {client.sent}"]})
                waiting.append(asyncio.create_task(note_when_done(job, future)))
            await asyncio.sleep(0.001)
        await asyncio.gather(*waiting)

    async with worker_for(queue, [flood, single], limits):
        flooding = asyncio.create_task(flood_client())
        await until(lambda: len(flood.forward_calls) >= 3)  # the flood is well under way
        sent_before = client.sent
        start = time.perf_counter()
        job, future = await client.send("single", {"inputs": ["urgent"]})
        try:
            await asyncio.wait_for(note_when_done(job, future), WAIT_S / 2)
        except TimeoutError:
            raise AssertionError("the single request starved behind the flood") from None
        latency = time.perf_counter() - start
        flood_done_by_then = len(finished) - 1
        await asyncio.sleep(0.02)
        stop_flooding.set()
        await asyncio.wait_for(flooding, 4 * WAIT_S)

    flood_ids = [f for f in finished if f.startswith("flood")]
    assert flood_done_by_then < len(flood_ids)  # the flood was still running
    later_flood = [f for f in flood_ids if int(f.split("-")[1]) > sent_before]
    assert later_flood, "the flood kept arriving after the single request"
    overtook = [f for f in later_flood if finished.index(f) < finished.index(job.id)]
    # Earliest deadline first: flood requests sent after the single one finish after it,
    # except those topping up the one flood batch that still held older flood requests.
    assert len(overtook) < limits.max_requests, overtook
    assert latency < WAIT_S / 2


# -- what this device can finish in time -------------------------------------------------


class HandingBackQueue(InProcessQueue):
    """The in-process queue, noting every job a worker hands back; a test may hold the
    hand-back until it opens ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.handed_back: list[Job] = []
        self.release = asyncio.Event()
        self.release.set()

    async def hand_back(self, jobs: Sequence[Job]) -> None:
        self.handed_back.extend(jobs)
        await self.release.wait()
        await super().hand_back(jobs)


def budget_gauge(model: str) -> float | None:
    return REGISTRY.get_sample_value("flotilla_batch_budget_tokens", {"model": model})


async def test_a_slower_device_takes_a_smaller_budget_for_the_same_latency_target() -> None:
    # Half of the 200 ms target is what one batch may take: 100 ms, about 1000 tokens on
    # the fast device (0.1 ms a token), a third of that on the slow one. Batches of
    # several sizes let the fit tell the cost per pass from the cost per token.
    target = BatchLimits(max_tokens=4096, max_requests=16, max_wait_s=0.0, latency_target_s=0.2)
    budgets = {}
    for name, seconds_per_token in (("fast-device", 1e-4), ("slow-device", 3e-4)):
        runtime = runtime_for(name, seconds_per_token=seconds_per_token)
        queue = InProcessQueue()
        worker = worker_for(queue, [runtime], target)
        assert worker.limits[name].max_tokens == 4096  # untimed: the profile's budget
        async with worker:
            for words in (5, 60, 20, 40, 10, 50, 30, 60, 5, 45):
                text = " ".join(f"w{k}" for k in range(words))
                assert isinstance(await outcome(await Client(queue).embed(name, [text])), JobResult)
            budgets[name] = worker.limits[name].max_tokens
        assert worker.capacity_tokens == budgets[name]
        assert budget_gauge(name) == budgets[name]
    assert budgets["fast-device"] == pytest.approx(1000, rel=0.3)
    assert budgets["slow-device"] / budgets["fast-device"] == pytest.approx(1 / 3, rel=0.3)


async def test_a_model_without_a_target_keeps_its_profiles_budget() -> None:
    runtime = runtime_for("untargeted", seconds_per_token=1e-3)
    queue = InProcessQueue()
    worker = worker_for(queue, [runtime])
    async with worker:
        for i in range(3):
            assert isinstance(
                await outcome(await Client(queue).embed("untargeted", [f"t {i}"])), JobResult
            )
    assert worker.limits["untargeted"] == FAST
    assert worker.capacity_tokens == FAST.max_tokens
    assert budget_gauge("untargeted") == FAST.max_tokens


async def test_jobs_far_from_their_deadlines_are_never_handed_back() -> None:
    runtime = runtime_for("alpha", seconds_per_token=1e-3)
    queue = HandingBackQueue()
    client = Client(queue)
    async with worker_for(queue, [runtime]):
        for _ in range(3):
            futures = [await client.embed("alpha", [f"job {i}"]) for i in range(8)]
            outcomes = [await outcome(f) for f in futures]
            assert all(isinstance(o, JobResult) for o in outcomes), outcomes
    assert queue.handed_back == []


async def test_a_job_this_device_would_finish_too_late_is_handed_back_once() -> None:
    # 20 ms a token, one job a batch: 80 ms a batch of four tokens, which the pace learns
    # as about 67 ms for the five tokens each is estimated at. Of three jobs due in 170 ms,
    # the third would finish at about 200 ms: it goes back to the queue for a faster
    # worker; back on its second delivery it is kept, and answered.
    runtime = runtime_for("alpha", seconds_per_token=0.02)
    queue = HandingBackQueue()
    client = Client(queue)
    one_each = BatchLimits(max_tokens=512, max_requests=1, max_wait_s=0.0)
    async with worker_for(queue, [runtime], one_each):
        for text in ("time", "the device"):
            assert isinstance(await outcome(await client.embed("alpha", [text])), JobResult)
        await until(lambda: runtime.forwards_done == 2)
        sent = [
            await client.send("alpha", {"inputs": [f"tight {i}"]}, timeout_s=0.17) for i in range(3)
        ]
        outcomes = [await outcome(future) for _, future in sent]
    assert [(job.id, job.deliveries) for job in queue.handed_back] == [(sent[2][0].id, 1)]
    assert all(isinstance(o, JobResult | DeadlineExceeded) for o in outcomes), outcomes
    assert all(isinstance(o, JobResult) for o in outcomes[:2]), outcomes


async def test_a_job_handed_back_goes_to_a_worker_waiting_for_work() -> None:
    # The slow worker waits for company, so right after handing the job back it pulls
    # again: a worker already waiting must get the job first.
    slow, fast = runtime_for("alpha", seconds_per_token=0.02), runtime_for("alpha")
    queue = HandingBackQueue()
    client = Client(queue)
    patient = BatchLimits(max_tokens=512, max_requests=16, max_wait_s=0.05)
    no_wait = BatchLimits(max_tokens=512, max_requests=16, max_wait_s=0.0)
    async with worker_for(queue, [slow], patient):
        for text in ("time", "the device"):
            assert isinstance(await outcome(await client.embed("alpha", [text])), JobResult)
        await until(lambda: slow.forwards_done == 2)
        queue.release.clear()
        # About 67 ms here, and due in 40.
        tight, future = await client.send("alpha", {"inputs": ["tight"]}, timeout_s=0.04)
        await until(lambda: bool(queue.handed_back))  # held on its way back
        async with worker_for(queue, [fast], no_wait):
            await asyncio.sleep(0.01)  # the fast worker now waits for work
            queue.release.set()
            answer = await outcome(future)
    assert [(job.id, job.deliveries) for job in queue.handed_back] == [(tight.id, 1)]
    assert isinstance(answer, JobResult | DeadlineExceeded), answer
    assert "tight" in fast.seen and "tight" not in slow.seen


# -- stopping --------------------------------------------------------------------------


async def test_stop_fails_every_pulled_job_instead_of_leaving_it_hanging() -> None:
    # One request per batch and a slow forward: when stop comes, one batch is running,
    # one waits in the hand-off queue, one is formed and waiting to be handed off, and
    # the rest are pending in the worker.
    runtime = runtime_for("alpha", seconds_per_token=0.05)
    queue = InProcessQueue()
    client = Client(queue)
    futures = [await client.embed("alpha", [f"job {i}"]) for i in range(5)]
    one_at_a_time = BatchLimits(max_tokens=512, max_requests=1, max_wait_s=0.0)
    worker = worker_for(queue, [runtime], one_at_a_time)
    await worker.start()
    await until(lambda: len(runtime.forward_calls) == 1 and queue.depth()["alpha"] == 0)
    await asyncio.sleep(0.01)  # let the former fill the hand-off queue
    await worker.stop()
    await worker.stop()  # idempotent

    outcomes = [await outcome(f) for f in futures]
    assert all(isinstance(o, DeadlineExceeded) for o in outcomes), outcomes
    assert len(runtime.forward_calls) == 1
    # The abandoned forward still runs in its thread; let it end before the loop closes.
    await until(lambda: runtime.forwards_done == 1)


# -- the model host --------------------------------------------------------------------


async def test_host_reports_loading_until_its_models_are_ready() -> None:
    gate = threading.Event()
    fakes = FakeLoader()

    def slow_loader(spec: ModelSpec, device: DeviceKind, threads: int) -> FakeRuntime:
        if spec.name == "slow":
            gate.wait(WAIT_S)
        return fakes(spec, device, threads)

    queue = InProcessQueue()
    host = ModelHost(
        fake_fleet("fast", "slow"),
        queue,
        options=[RequestLimits()],
        device="cpu",
        loaders=encoder_loaders(slow_loader),
    )
    try:
        async with host:
            await until(lambda: host.state("fast") == "ready")
            assert host.state("slow") == "loading"
            assert "profile" not in host.describe("slow")  # only its residency, so far
            assert host.describe("slow")["loads"] == 0
            # The model already loaded serves while the next one loads.
            assert host.state("fast") == "ready"
            early = await Client(queue).embed("fast", ["early"])
            early_result = await asyncio.wait_for(early, WAIT_S)
            gate.set()
            await asyncio.wait_for(host.wait_ready(), WAIT_S)
            assert host.state("slow") == "ready"
            assert host.state("fast") == "ready"
            assert host.describe("slow")["kind"] == "bi-encoder"
            future = await Client(queue).embed("slow", ["served"])
            result = await asyncio.wait_for(future, WAIT_S)
    finally:
        gate.set()  # never leave the loader thread blocked
    runtime = fakes.runtimes["slow"]
    np.testing.assert_allclose(vectors_of(result), expected(runtime, ["served"]), atol=1e-6)
    fast = fakes.runtimes["fast"]
    np.testing.assert_allclose(vectors_of(early_result), expected(fast, ["early"]), atol=1e-6)
    assert host.state("fast") == "loading"  # stopped on exit: serves nothing


async def test_host_marks_a_model_that_fails_to_load_and_serves_the_others() -> None:
    fakes = FakeLoader()

    def loader(spec: ModelSpec, device: DeviceKind, threads: int) -> FakeRuntime:
        if spec.name == "broken":
            raise RuntimeError("weights are corrupt")
        return fakes(spec, device, threads)

    queue = InProcessQueue()
    host = ModelHost(
        fake_fleet("broken", "alpha"),
        queue,
        options=[RequestLimits()],
        device="cpu",
        loaders=encoder_loaders(loader),
    )
    async with host:
        await asyncio.wait_for(host.wait_ready(), WAIT_S)
        assert host.state("broken") == "failed"
        assert host.describe("broken")["error"] == "RuntimeError: weights are corrupt"
        assert host.state("alpha") == "ready"
        future = await Client(queue).embed("alpha", ["still served"])
        result = await asyncio.wait_for(future, WAIT_S)
    expected_vectors = expected(fakes.runtimes["alpha"], ["still served"])
    np.testing.assert_allclose(vectors_of(result), expected_vectors, atol=1e-6)


async def test_host_uses_the_device_profile_for_batch_limits() -> None:
    fleet = fake_fleet("alpha")
    async with ModelHost(
        fleet,
        InProcessQueue(),
        options=[RequestLimits()],
        device="cpu",
        loaders=encoder_loaders(FakeLoader()),
    ) as host:
        await asyncio.wait_for(host.wait_ready(), WAIT_S)
        limits = LoadedEncoders(host.engines)["alpha"].limits
    assert limits == BatchLimits(
        max_tokens=512, max_requests=16, max_wait_s=0.001, mix_adapters=True
    )


@pytest.mark.parametrize("names", [("broken",), ("broken", "also-broken")])
async def test_host_with_no_loadable_model_starts_no_worker(names: tuple[str, ...]) -> None:
    def loader(spec: ModelSpec, device: DeviceKind, threads: int) -> FakeRuntime:
        raise OSError("no weights")

    host = ModelHost(
        fake_fleet(*names),
        InProcessQueue(),
        options=[RequestLimits()],
        device="cpu",
        loaders=encoder_loaders(loader),
    )
    async with host:
        await asyncio.wait_for(host.wait_ready(), WAIT_S)
        assert "encoder" not in host.engines
        assert all(host.state(name) == "failed" for name in names)


async def test_a_job_whose_model_was_removed_while_it_waited_goes_back_to_the_queue() -> None:
    # A job the worker holds (here: put back by the runner, as it does for an adapter's
    # build) whose model was removed meanwhile, by an eviction or the admin API: the
    # former hands it back and carries on serving the models it still has.
    queue = InProcessQueue()
    client = Client(queue)
    async with worker_for(queue, [runtime_for("alpha"), runtime_for("beta")]) as worker:
        worker.remove_model("beta")
        _, waiting = await client.send("beta", {"inputs": ["held"]})
        [pulled] = await queue.pull(["beta"], 1000, 1.0)
        worker._put_back([pulled])
        answered = await outcome(await client.embed("alpha", ["still served"]))
        assert isinstance(answered, JobResult)
        await until(lambda: queue.depth()["beta"] == 1)  # waiting for beta's next host
        assert worker.running() and not waiting.done()
