"""The JetStream work queue in one process against the real nats-server: a job's round
trip, errors with their class and status, the budget kept (most urgent first, a job over
it handed to another worker), expired jobs terminated, duplicate and late replies dropped,
what a stopping worker leaves unanswered taken by another, a job nobody answers
dead-lettered with a clear error for its client, liveness for 503s, and streams,
consumers and bucket created idempotently."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator

import nats
import pytest

from bench.services.nats import NatsServer
from embedder.core.errors import (
    DeadlineExceeded,
    InvalidRequest,
    LimitExceeded,
    NotReady,
    Undeliverable,
)
from embedder.core.jobs import ApiShape, Job, JobResult, ModelState, Timings
from embedder.queue.jetstream import fetcher, wire
from embedder.queue.jetstream.config import JetStreamConfig, Lane, subject_token
from embedder.queue.jetstream.liveness import FleetLiveness, WorkerLiveness
from embedder.queue.jetstream.puller import JetStreamPuller
from embedder.queue.jetstream.streams import ensure_consumer, ensure_streams, workers_bucket
from embedder.queue.jetstream.submitter import JetStreamSubmitter, _Reassembly
from embedder.queue.protocol import Partial, ReplyStream
from tests.distributed.helpers import eventually
from tests.kafka.fixtures import unique_name

pytestmark = pytest.mark.slow  # starts the server

WAIT_S = 10.0


@pytest.fixture
def config() -> JetStreamConfig:
    return queue_config()


def queue_config(**changes: object) -> JetStreamConfig:
    """A queue of the test's own on the shared server, with ``changes`` to its settings."""
    tag = unique_name("t").replace("-", "_").upper()
    return JetStreamConfig(
        stream=f"JOBS_{tag}",
        subject_prefix=f"jobs.{tag}",
        storage="memory",
        # Memory streams reserve their max_bytes on the shared server: keep each small.
        max_bytes=32 * 1024 * 1024,
        ack_wait_s=2.0,
    ).model_copy(update=changes)


def job(id: str, *, model: str = "alpha", tokens: int = 10, deadline_in_s: float = 30.0) -> Job:
    now = time.time()
    return Job(
        id=id,
        model=model,
        shape=ApiShape.TEI_EMBED,
        body=f'{{"inputs": "{id}"}}'.encode(),
        est_tokens=tokens,
        deadline=now + deadline_in_s,
        enqueued_at=now,
    )


def result(text: str) -> JobResult:
    return JobResult(body=text.encode(), prompt_tokens=3, timings=Timings(0.01, 0.02))


@contextlib.asynccontextmanager
async def queue(
    server: NatsServer, config: JetStreamConfig, workers: int = 1
) -> AsyncIterator[tuple[JetStreamSubmitter, list[JetStreamPuller]]]:
    submitter = JetStreamSubmitter(url=server.url, inbox=unique_name("inbox"), config=config)
    pullers = [JetStreamPuller(url=server.url, config=config) for _ in range(workers)]
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(submitter)
        for puller in pullers:
            await stack.enter_async_context(puller)
        yield submitter, pullers


async def pull_jobs(puller: JetStreamPuller, count: int, max_tokens: int = 1_000) -> list[Job]:
    """Pulls until ``count`` jobs came: a pull takes what the server has delivered so far,
    which under load may be fewer than were put."""
    got: list[Job] = []
    async with asyncio.timeout(WAIT_S):
        while len(got) < count:
            got += await puller.pull(["alpha"], max_tokens, 0.5)
    return got


async def pull_until(puller: JetStreamPuller, count: int, max_tokens: int = 1_000) -> list[str]:
    return [job.id for job in await pull_jobs(puller, count, max_tokens)]


async def bodies(futures: dict[str, asyncio.Future[JobResult]]) -> dict[str, str]:
    async with asyncio.timeout(WAIT_S):
        return {job_id: (await future).body.decode() for job_id, future in futures.items()}


async def test_round_trip_result_and_error_then_nothing_is_left(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        ok, bad = await submitter.put(job("j1")), await submitter.put(job("j2"))
        assert submitter.depth() == {"alpha": 2}
        pulled = await pull_jobs(puller, 2)
        assert sorted(j.id for j in pulled) == ["j1", "j2"]
        assert pulled[0].body == f'{{"inputs": "{pulled[0].id}"}}'.encode()  # body unparsed
        await puller.complete("j1", result("one"))
        await puller.complete("j2", InvalidRequest("no inputs"))
        async with asyncio.timeout(WAIT_S):
            assert (await ok).body == b"one"
            with pytest.raises(InvalidRequest, match="no inputs"):
                await bad
        assert submitter.depth() == {}
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await eventually(
            lambda: _empty(js, config), "the acked jobs to leave the work queue", WAIT_S
        )
        await nc.close()


async def test_a_streamed_answer_arrives_in_parts_then_whole(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        stream = await submitter.put_streaming(job("s1"))
        [pulled] = await puller.pull(["alpha"], 1_000, WAIT_S)
        for seq, body in enumerate([b"a", b"b", b"c"]):
            assert await puller.partial(pulled.id, Partial(seq, body))
        await puller.complete(pulled.id, result("end"))
        async with asyncio.timeout(WAIT_S):
            got = [await stream.next() for _ in range(4)]
        assert got[:3] == [Partial(0, b"a"), Partial(1, b"b"), Partial(2, b"c")]
        assert isinstance(got[3], JobResult) and got[3].body == b"end"
        assert not await puller.partial(pulled.id, Partial(3, b"late"))  # answered: no more


async def test_parts_are_put_in_order_and_repeats_dropped() -> None:
    stream = ReplyStream(asyncio.get_running_loop().create_future())
    parts = _Reassembly(stream)
    added = [parts.add(Partial(n, bytes([n]))) for n in (1, 0, 0, 2, 1)]
    assert added == [True, True, False, True, False]
    assert [await stream.next() for _ in range(3)] == [Partial(n, bytes([n])) for n in range(3)]


async def _empty(js: nats.js.JetStreamContext, config: JetStreamConfig) -> bool:
    return (await js.stream_info(config.stream)).state.messages == 0


async def test_what_is_over_the_budget_is_handed_back_to_another_worker(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config, workers=2) as (submitter, [first, second]):
        futures = [await submitter.put(job(f"j{i}", tokens=100)) for i in range(2)]
        # Budget for one: the second is nak'ed and the other worker takes it.
        taken = await first.pull(["alpha"], 150, WAIT_S)
        assert len(taken) == 1
        other = await pull_until(second, 1)
        assert other != [taken[0].id]
        await first.complete(taken[0].id, result("a"))
        await second.complete(other[0], result("b"))
        async with asyncio.timeout(WAIT_S):
            assert sorted([(await f).body for f in futures]) == [b"a", b"b"]


async def test_workers_of_several_models_lose_no_job_to_a_fetch_left_running(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    """A worker's fetches for its models run together and the first to bring something
    ends the wait. The others must keep what they take: a message dropped there waits
    out ``ack_wait`` before redelivery (here a minute, far beyond the bound below)."""
    config = config.model_copy(update={"ack_wait_s": 60.0})
    models = ["alpha", "beta", "gamma", "delta"]
    arrivals = random.Random(7)
    async with queue(nats_server, config, workers=3) as (submitter, pullers):

        async def work(puller: JetStreamPuller, hosted: list[str]) -> None:
            while True:
                taken = await puller.pull(hosted, 1_000, 0.25)
                await asyncio.sleep(0.03)  # the forward
                for j in taken:
                    await puller.complete(j.id, result(j.id))

        workers = [
            asyncio.create_task(work(p, [models[i], models[i + 1]])) for i, p in enumerate(pullers)
        ]
        futures = []
        for i in range(150):  # an open loop at 45/s over the four models
            futures.append(await submitter.put(job(f"j{i}", model=arrivals.choice(models))))
            await asyncio.sleep(arrivals.expovariate(45.0))
        try:
            async with asyncio.timeout(5.0):
                answers = [(await f).body for f in futures]
        finally:
            for w in workers:
                w.cancel()
        assert sorted(answers) == sorted(f"j{i}".encode() for i in range(150))


async def test_a_job_handed_back_goes_at_once_to_a_worker_that_asks(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    """No nak delay and no ack_wait: the worker that asks next has it, as a second
    delivery; the one that handed it back no longer answers for it."""
    config = config.model_copy(update={"ack_wait_s": 60.0, "nak_delay_ms": 5_000})
    async with queue(nats_server, config, workers=2) as (submitter, [slow, fast]):
        future = await submitter.put(job("j1"))
        [taken] = await slow.pull(["alpha"], 1_000, WAIT_S)
        assert taken.deliveries == 1
        asking = asyncio.ensure_future(fast.pull(["alpha"], 1_000, WAIT_S))
        await asyncio.sleep(0.1)
        await slow.hand_back([taken])
        async with asyncio.timeout(1.0):
            [again] = await asking
        assert (again.id, again.deliveries) == ("j1", 2)
        assert slow.cancelled(["j1"]) == {"j1"}
        await slow.hand_back([taken])  # no longer held: nothing to hand back
        await fast.complete("j1", result("fast"))
        async with asyncio.timeout(WAIT_S):
            assert (await future).body == b"fast"


async def test_expired_jobs_are_terminated_not_run(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        await submitter.put(job("late", deadline_in_s=0.3))
        await asyncio.sleep(0.4)
        await submitter.put(job("fresh"))
        assert await pull_until(puller, 1) == ["fresh"]
        assert await puller.pull(["alpha"], 1_000, 0.3) == []
        nc = await nats.connect(nats_server.url)
        info = await nc.jetstream().consumer_info(config.stream, config.consumer("alpha"))
        await nc.close()
        assert info.num_ack_pending == 1 and info.num_redelivered == 0  # only "fresh" is held


async def test_a_job_nobody_answers_is_dead_lettered_and_its_client_told(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    config = config.model_copy(update={"max_deliver": 2, "ack_wait_s": 0.3})
    async with queue(nats_server, config) as (submitter, [puller]):
        future = await submitter.put(job("poison"))
        # A worker that takes the job and dies, twice: fetched, never acked.
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        durable = await ensure_consumer(js, config, Lane("alpha", 0))
        sub = await js.pull_subscribe_bind(durable=durable, stream=config.stream)
        for _ in range(2):
            [msg] = await sub.fetch(1, timeout=WAIT_S)
            assert wire.decode_job(msg.headers, msg.data)[0].id == "poison"
        # The server gives up on it when a worker next asks for work: none is handed out.
        assert await puller.pull(["alpha"], 1_000, 1.0) == []
        async with asyncio.timeout(WAIT_S):
            with pytest.raises(Undeliverable, match="delivered 2 times"):
                await future
        dead = await js.get_last_msg(config.dead_stream, config.dead_subject("alpha"))
        assert dead.headers is not None
        assert "2 times" in dead.headers[wire.DEAD_REASON]
        assert dead.data == b'{"inputs": "poison"}'
        assert (await js.stream_info(config.stream)).state.messages == 0
        await nc.close()


class States:
    def state(self, model: str) -> ModelState:
        return "ready"

    def describe(self, model: str) -> dict[str, object]:
        return {"runtime": "fake"}


async def test_a_model_is_ready_while_a_live_worker_serves_it(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with FleetLiveness(url=nats_server.url, config=config) as fleet:
        assert fleet.state("alpha") == "loading"  # no worker: the gateway answers 503
        worker = WorkerLiveness(
            url=nats_server.url, worker_id="w1", models=["alpha"], states=States(),
            config=config, interval_s=0.2,
        )  # fmt: skip
        async with worker:
            await eventually(lambda: fleet.state("alpha") == "ready", "the worker seen", WAIT_S)
            assert fleet.describe("alpha") == {"runtime": "fake", "workers": 1}
            assert fleet.state("beta") == "loading"
        await eventually(lambda: fleet.state("alpha") == "loading", "its goodbye", WAIT_S)
    # A gateway started later knows the live workers from the bucket at once.
    second = WorkerLiveness(
        url=nats_server.url, worker_id="w2", models=["alpha"], states=States(), config=config
    )
    async with second, FleetLiveness(url=nats_server.url, config=config) as late:
        assert late.state("alpha") == "ready"


async def test_streams_consumers_and_bucket_are_created_idempotently(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    for _ in range(2):
        await ensure_streams(js, config)
        assert await ensure_consumer(js, config, Lane("org/model.v1", 0)) == config.consumer(
            "org/model.v1"
        )
        await workers_bucket(js, config, 3.0)
    info = await js.stream_info(config.stream)
    assert str(info.config.retention) in ("workqueue", "RetentionPolicy.WORK_QUEUE")
    consumer = await js.consumer_info(config.stream, config.consumer("org/model.v1"))
    assert consumer.config.max_deliver == config.max_deliver
    assert consumer.config.filter_subject == config.subject("org/model.v1")
    await nc.close()


def test_model_names_map_to_distinct_subject_tokens() -> None:
    names = ["a.b", "a_2Eb", "a/b", "a b", "a*", "a>", "ü"]
    tokens = [subject_token(n) for n in names]
    assert len(set(tokens)) == len(names)
    assert all(t.replace("_", "").replace("-", "").isalnum() for t in tokens)


async def test_an_error_comes_back_with_its_class_status_and_headers(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        futures = [await submitter.put(job(f"j{i}")) for i in range(2)]
        assert sorted(await pull_until(puller, 2)) == ["j0", "j1"]
        await puller.complete("j0", InvalidRequest("inputs must be strings"))
        await puller.complete("j1", NotReady("warming up", retry_after_s=9))
        async with asyncio.timeout(WAIT_S):
            with pytest.raises(InvalidRequest, match="inputs must be strings") as invalid:
                await futures[0]
            with pytest.raises(NotReady) as not_ready:
                await futures[1]
        assert invalid.value.http_status == 422
        assert not_ready.value.http_status == 503
        assert not_ready.value.headers == {"Retry-After": "9"}


async def test_pull_keeps_to_the_budget_and_hands_out_the_most_urgent_first(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        for i, deadline in enumerate([30, 10, 20]):
            await submitter.put(job(f"j{i}", tokens=100, deadline_in_s=deadline))
        # Room for two of the three fetched: the two most urgent, the third handed back.
        first = await puller.pull(["alpha"], 250, WAIT_S)
        assert [j.id for j in first] == ["j1", "j2"]
        assert await pull_until(puller, 1, max_tokens=250) == ["j0"]
        # Over the budget, still one: else a job bigger than every worker's room starves.
        await submitter.put(job("big", tokens=1_000))
        assert await pull_until(puller, 1, max_tokens=250) == ["big"]


async def test_a_slow_first_fetch_still_takes_the_requests_waiting_behind_it(
    nats_server: NatsServer, config: JetStreamConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a busy machine the first fetch can take longer than the backlog window even
    with requests waiting: the server's count of them, not the time, decides."""
    monkeypatch.setattr(fetcher, "BACKLOG_S", -1.0)  # every first fetch is "slow"
    async with queue(nats_server, config) as (submitter, [puller]):
        for i in range(5):
            await submitter.put(job(f"j{i}", tokens=10))
        assert sorted(j.id for j in await puller.pull(["alpha"], 1_000, WAIT_S)) == [
            f"j{i}" for i in range(5)
        ]


async def test_a_duplicate_or_unknown_reply_is_dropped(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        future = await submitter.put(job("j1"))
        await pull_until(puller, 1)
        await puller.complete("j1", result("first"))
        async with asyncio.timeout(WAIT_S):
            assert (await future).body == b"first"
        nc = await nats.connect(nats_server.url)
        for job_id, text in [("j1", "second"), ("nobody", "stray")]:
            payload, headers = wire.encode_outcome(job_id, result(text))
            await nc.publish(submitter.inbox, payload, headers=headers)
        await nc.flush()
        await nc.close()
        await eventually(lambda: submitter.dropped_replies == 2, "both replies dropped", WAIT_S)
        assert (await future).body == b"first"


async def test_a_withdrawn_job_still_runs_but_its_reply_is_dropped(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        future = await submitter.put(job("j1"))
        future.cancel()  # the client left: the gateway withdraws it locally only
        await asyncio.sleep(0)  # done callbacks run on the next loop turn
        assert submitter.depth() == {}
        assert await pull_until(puller, 1) == ["j1"]
        await puller.complete("j1", result("late"))
        await eventually(lambda: submitter.dropped_replies == 1, "the late reply dropped", WAIT_S)


async def test_what_a_stopping_worker_left_unanswered_goes_to_the_next_at_once(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config, workers=0) as (submitter, []):
        futures = {f"j{i}": await submitter.put(job(f"j{i}")) for i in range(6)}
        async with JetStreamPuller(url=nats_server.url, config=config) as first:
            assert sorted(await pull_until(first, 6)) == sorted(futures)
            for job_id in ("j0", "j1", "j3"):
                await first.complete(job_id, result(f"first {job_id}"))
            # stopped with j2, j4, j5 in hand: they are handed back, not left to ack_wait
        started = time.monotonic()
        async with JetStreamPuller(url=nats_server.url, config=config) as second:
            again = await pull_until(second, 3)
            assert time.monotonic() - started < config.ack_wait_s
            assert sorted(again) == ["j2", "j4", "j5"]
            for job_id in again:
                await second.complete(job_id, result(f"second {job_id}"))
            assert await bodies(futures) == {
                "j0": "first j0",
                "j1": "first j1",
                "j2": "second j2",
                "j3": "first j3",
                "j4": "second j4",
                "j5": "second j5",
            }
        assert submitter.dropped_replies == 0


async def test_drain_answers_the_jobs_in_hand_and_leaves_the_rest_to_others(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config, workers=2) as (submitter, [first, second]):
        futures = {f"j{i}": await submitter.put(job(f"j{i}", tokens=100)) for i in range(4)}
        handed = await first.pull(["alpha"], 250, WAIT_S)
        assert len(handed) == 2
        draining = asyncio.create_task(first.drain(timeout_s=WAIT_S))
        await asyncio.sleep(0.1)
        assert await first.pull(["alpha"], 1_000, 0.1) == []  # no more fetching
        assert not draining.done()  # waits for the two in hand
        for j in handed:
            await first.complete(j.id, result("drained"))
        async with asyncio.timeout(WAIT_S):
            assert await draining == 0
        for job_id in await pull_until(second, 2):
            await second.complete(job_id, result("next"))
        assert sorted((await bodies(futures)).values()) == ["drained", "drained", "next", "next"]


async def test_a_large_reply_arrives_and_one_over_max_payload_is_a_clear_error(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        big, huge = await submitter.put(job("big")), await submitter.put(job("huge"))
        await pull_until(puller, 2)
        body = bytes(range(256)) * (3 * 4096)  # 3 MiB: over NATS's default 1 MiB payload
        await puller.complete("big", JobResult(body=body, prompt_tokens=1, timings=Timings(0, 0)))
        over = b"x" * (puller._link.nc.max_payload + 1)
        await puller.complete("huge", JobResult(body=over, prompt_tokens=1, timings=Timings(0, 0)))
        async with asyncio.timeout(WAIT_S):
            assert (await big).body == body
            with pytest.raises(LimitExceeded, match="max_payload") as refused:
                await huge
        assert refused.value.http_status == 413


async def test_a_job_past_its_deadline_is_refused_at_put(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config, workers=0) as (submitter, []):
        with pytest.raises(DeadlineExceeded):
            await submitter.put(job("late", deadline_in_s=-1.0))
        assert submitter.depth() == {}


async def test_pulling_before_the_puller_started_waits_instead_of_failing(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    """A worker's loop may pull before the queue connection is up: empty pulls, no error."""
    puller = JetStreamPuller(url=nats_server.url, config=config)
    started = time.monotonic()
    assert await puller.pull(["alpha"], 1_000, 0.05) == []
    assert time.monotonic() - started >= 0.04  # waited its timeout: no busy loop
    async with puller:
        assert await puller.pull(["alpha"], 1_000, 0.05) == []
