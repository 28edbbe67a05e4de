"""The work queue over Kafka, in-process against the real broker: a job's round trip,
errors with their status, expired jobs skipped, duplicate replies dropped, and commits that
cover only answered work, so another member gets what a stopped one left unanswered."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from embedder.errors import DeadlineExceeded, InvalidRequest, NotReady
from embedder.jobs import ApiShape, EmbedJob, JobResult, Timings
from embedder.queue.kafka import wire
from embedder.queue.kafka.puller import COMMIT_INTERVAL_S, KafkaPuller
from embedder.queue.kafka.submitter import KafkaSubmitter
from tests.distributed.helpers import eventually
from tests.kafka.broker import KafkaBroker
from tests.kafka.fixtures import unique_name

pytestmark = pytest.mark.slow  # starts the broker

WAIT_S = 20.0  # bounds every wait: a broken test fails, never hangs


@dataclass(frozen=True)
class Names:
    bootstrap: str
    requests: str
    replies: str
    group: str


@pytest.fixture
def names(kafka_broker: KafkaBroker) -> Names:
    return Names(
        kafka_broker.bootstrap, unique_name("req"), unique_name("reply"), unique_name("workers")
    )


def job(
    id: str, *, model: str = "alpha", tokens: int = 10, deadline_in_s: float = 30.0
) -> EmbedJob:
    now = time.time()
    return EmbedJob(
        id=id,
        model=model,
        shape=ApiShape.TEI_EMBED,
        body=f'{{"inputs": "{id}"}}'.encode(),
        est_tokens=tokens,
        deadline=now + deadline_in_s,
        enqueued_at=now,
    )


def result(text: str) -> JobResult:
    return JobResult(body=text.encode(), prompt_tokens=3, timings=Timings(0.001, 0.002))


@contextlib.asynccontextmanager
async def submitter(names: Names, partitions: int = 1) -> AsyncIterator[KafkaSubmitter]:
    async with KafkaSubmitter(
        bootstrap=names.bootstrap,
        request_topic=names.requests,
        reply_topic=names.replies,
        request_partitions=partitions,
    ) as s:
        yield s


def puller(names: Names, partitions: int = 1) -> KafkaPuller:
    return KafkaPuller(
        bootstrap=names.bootstrap, topic=names.requests, group=names.group, partitions=partitions
    )


async def pull_n(
    p: KafkaPuller, count: int, models: tuple[str, ...] = ("alpha",)
) -> list[EmbedJob]:
    """Pull until ``count`` jobs came (the first pulls wait for the group to assign)."""
    got: list[EmbedJob] = []
    async with asyncio.timeout(WAIT_S):
        while len(got) < count:
            got.extend(await p.pull(models, max_tokens=10_000, timeout_s=0.2))
    return got


async def test_a_job_goes_out_and_its_result_comes_back(names: Names) -> None:
    async with submitter(names) as s, puller(names) as p:
        sent = job("j1")
        future = await s.put(sent)
        assert s.depth() == {"alpha": 1}
        [pulled] = await pull_n(p, 1)
        assert pulled == sent
        await p.complete("j1", result("vectors"))
        async with asyncio.timeout(WAIT_S):
            assert await future == result("vectors")
        assert s.depth() == {}


async def test_an_error_comes_back_with_its_class_and_status(names: Names) -> None:
    async with submitter(names) as s, puller(names) as p:
        futures = [await s.put(job(f"j{i}")) for i in range(2)]
        await pull_n(p, 2)
        await p.complete("j0", InvalidRequest("inputs must be strings"))
        await p.complete("j1", NotReady("warming up", retry_after_s=9))
        async with asyncio.timeout(WAIT_S):
            with pytest.raises(InvalidRequest, match="inputs must be strings") as invalid:
                await futures[0]
            with pytest.raises(NotReady) as not_ready:
                await futures[1]
        assert invalid.value.http_status == 422
        assert not_ready.value.http_status == 503
        assert not_ready.value.headers == {"Retry-After": "9"}


async def test_pull_keeps_to_the_budget_and_hands_out_the_most_urgent_first(
    names: Names,
) -> None:
    async with submitter(names) as s:
        for i, deadline in enumerate([30, 10, 20]):
            await s.put(job(f"j{i}", tokens=10, deadline_in_s=deadline))
        # Put before the worker joins, so its first fetch reads all three at once.
        async with puller(names) as p, asyncio.timeout(WAIT_S):
            first: list[EmbedJob] = []
            while not first:
                first = await p.pull(["alpha"], max_tokens=25, timeout_s=0.2)
            assert [j.id for j in first] == ["j1", "j2"]
            assert [j.id for j in await p.pull(["alpha"], max_tokens=25, timeout_s=0)] == ["j0"]
            # Over the budget, still one: else a job bigger than every worker's room starves.
            await s.put(job("big", tokens=1_000))
            assert [j.id for j in await pull_n(p, 1)] == ["big"]


async def test_expired_jobs_are_skipped_and_committed(names: Names) -> None:
    async with submitter(names) as s:
        await s.put(job("stale", deadline_in_s=0.2))
        live = await s.put(job("live"))
        await asyncio.sleep(0.4)  # the first one's deadline passes before any worker reads it
        async with puller(names) as p:
            assert [j.id for j in await pull_n(p, 1)] == ["live"]
            assert p.skipped_expired == 1
            await p.complete("live", result("ok"))
            async with asyncio.timeout(WAIT_S):
                await live
            await asyncio.sleep(3 * COMMIT_INTERVAL_S)
        assert await committed(names, 0) == 2  # both offsets: nobody waits for the stale one


async def test_a_duplicate_or_unknown_reply_is_dropped(names: Names) -> None:
    async with submitter(names) as s, puller(names) as p:
        future = await s.put(job("j1"))
        await pull_n(p, 1)
        await p.complete("j1", result("first"))
        async with asyncio.timeout(WAIT_S):
            assert (await future).body == b"first"
        producer = AIOKafkaProducer(bootstrap_servers=names.bootstrap)
        await producer.start()
        try:
            for job_id, text in [("j1", "second"), ("nobody", "stray")]:
                value, headers = wire.encode_outcome(job_id, result(text))
                await producer.send_and_wait(names.replies, value=value, headers=headers)
        finally:
            await producer.stop()
        await eventually(lambda: s.dropped_replies == 2, "both replies to be dropped")
        assert (await future).body == b"first"


async def test_a_withdrawn_job_still_runs_but_its_reply_is_dropped(names: Names) -> None:
    async with submitter(names) as s, puller(names) as p:
        future = await s.put(job("j1"))
        future.cancel()  # the client left: the gateway withdraws it locally only
        await asyncio.sleep(0)  # done callbacks run on the next loop turn
        assert s.depth() == {}
        [pulled] = await pull_n(p, 1)
        await p.complete(pulled.id, result("late"))
        await eventually(lambda: s.dropped_replies == 1, "the late reply to be dropped")


async def test_commits_cover_only_answered_jobs_so_the_next_member_gets_the_rest(
    names: Names,
) -> None:
    async with submitter(names) as s:
        futures = {f"j{i}": await s.put(job(f"j{i}")) for i in range(6)}
        first = puller(names)
        async with first:
            pulled = await pull_n(first, 6)
            assert [j.id for j in pulled] == [f"j{i}" for i in range(6)]  # one partition: in order
            for job_id in ("j0", "j1", "j3"):  # j2 stays unanswered: the commit stops there
                await first.complete(job_id, result(f"first {job_id}"))
            await asyncio.sleep(3 * COMMIT_INTERVAL_S)
            # stopped without answering j2, j4, j5: as a worker killed mid-batch leaves them
        assert await committed(names, 0) == 2
        second = puller(names)
        async with second:
            again = await pull_n(second, 4)
            assert [j.id for j in again] == ["j2", "j3", "j4", "j5"]
            for j in again:
                await second.complete(j.id, result(f"second {j.id}"))
            async with asyncio.timeout(WAIT_S):
                bodies = {k: (await f).body.decode() for k, f in futures.items()}
            await asyncio.sleep(3 * COMMIT_INTERVAL_S)
        assert bodies == {
            "j0": "first j0",
            "j1": "first j1",
            "j2": "second j2",
            "j3": "first j3",  # the gateway keeps the first reply; the second is dropped
            "j4": "second j4",
            "j5": "second j5",
        }
        await eventually(lambda: s.dropped_replies == 1, "the second j3 reply to be dropped")
        assert await committed(names, 0) == 6


async def test_jobs_held_across_a_rebalance_go_to_whoever_owns_them_after(
    names: Names,
) -> None:
    async with submitter(names, partitions=2) as s:
        futures = {f"j{i}": await s.put(job(f"j{i}")) for i in range(6)}
        first = puller(names, partitions=2)
        async with first:
            ids = [j.id for j in await pull_n(first, 6)]  # handed out, none answered
            assert first.cancelled(ids) == set()
            second = puller(names, partitions=2)
            async with second:
                # The second member's join revokes the first's partitions; after a short
                # wait for answers that do not come, the first lets its jobs go, and the
                # worker is told so that it does not run them.
                await eventually(lambda: first.cancelled(ids) == set(ids), "the jobs to go")
                again: list[EmbedJob] = []

                async def both_pull() -> bool:
                    for p in (first, second):
                        for j in await p.pull(["alpha"], max_tokens=100, timeout_s=0.1):
                            again.append(j)
                            await p.complete(j.id, result(j.id))
                    return len(again) == 6

                await eventually(both_pull, "the six jobs to be read again")
                async with asyncio.timeout(WAIT_S):
                    assert {k: (await f).body.decode() for k, f in futures.items()} == {
                        k: k for k in futures
                    }
        assert s.dropped_replies == 0


async def test_drain_answers_the_jobs_in_hand_and_leaves_the_unread_ones(names: Names) -> None:
    async with submitter(names) as s:
        futures = [await s.put(job(f"j{i}", tokens=10)) for i in range(4)]
        first = puller(names)
        async with first:
            async with asyncio.timeout(WAIT_S):
                while first.in_hand() < 4:  # all four read, two handed out
                    taken = await first.pull(["alpha"], max_tokens=20, timeout_s=0.2)
                    if taken:
                        handed = taken
            draining = asyncio.create_task(first.drain(timeout_s=WAIT_S))
            await asyncio.sleep(0.1)
            assert await first.pull(["alpha"], max_tokens=100, timeout_s=0) == []
            for j in handed:
                await first.complete(j.id, result("drained"))
            assert await draining == 0
        second = puller(names)
        async with second:
            left = await pull_n(second, 2)
            for j in left:
                await second.complete(j.id, result("next"))
            async with asyncio.timeout(WAIT_S):
                bodies = sorted([(await f).body for f in futures])
        assert bodies == [b"drained", b"drained", b"next", b"next"]


async def test_a_job_for_a_model_this_worker_lacks_gets_a_clear_error(names: Names) -> None:
    async with submitter(names) as s, puller(names) as p:
        future = await s.put(job("j1", model="gamma"))
        async with asyncio.timeout(WAIT_S):
            while p.in_hand():
                await p.pull(["alpha"], max_tokens=100, timeout_s=0.2)
            while not p.in_hand() and not future.done():
                assert await p.pull(["alpha"], max_tokens=100, timeout_s=0.2) == []
            with pytest.raises(NotReady, match="does not serve 'gamma'"):
                await future


async def test_a_reply_larger_than_a_default_kafka_record_arrives(names: Names) -> None:
    async with submitter(names) as s, puller(names) as p:
        future = await s.put(job("big"))
        await pull_n(p, 1)
        body = bytes(range(256)) * (3 * 4096)  # 3 MiB: over Kafka's default 1 MiB
        await p.complete("big", JobResult(body=body, prompt_tokens=1, timings=Timings(0, 0)))
        async with asyncio.timeout(WAIT_S):
            assert (await future).body == body


async def test_a_job_past_its_deadline_is_refused_at_put(names: Names) -> None:
    async with submitter(names) as s:
        with pytest.raises(DeadlineExceeded):
            await s.put(job("late", deadline_in_s=-1.0))


async def committed(names: Names, partition: int) -> int | None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=names.bootstrap, group_id=names.group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(names.requests, partition))  # type: ignore[no-any-return]
    finally:
        await consumer.stop()


async def test_pulling_while_the_consumer_joins_waits_instead_of_failing(names: Names) -> None:
    """A worker pulls as soon as its first model loads, which can be while the puller is
    still joining the group: those pulls come back empty, and the loop survives."""
    p = puller(names)
    starting = asyncio.create_task(p.start())
    pulls = 0
    while not starting.done():
        assert await p.pull(["alpha"], 1_000, 0.001) == []
        pulls += 1
    await starting
    try:
        assert pulls > 1
    finally:
        await p.stop()
