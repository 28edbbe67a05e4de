"""The JetStream work queue through broker faults, in one process against real
nats-servers: a liveness bucket deleted under a running fleet is made again and the
fleet seen again; a server killed and restarted (memory storage: it loses every stream,
consumer and the bucket) is answered by a prompt 503 while down, then everything is
made again, the jobs waited for are answered and withdrawals still arrive; a stalled
server's silence becomes a 503 within the publish bound, not a wait for the deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest

from bench.services.nats import NatsCluster, NatsServer
from embedder.core.errors import NotReady
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.liveness import FleetLiveness, WorkerLiveness
from embedder.queue.jetstream.puller import JetStreamPuller
from embedder.queue.jetstream.submitter import JetStreamSubmitter
from tests.distributed.helpers import eventually
from tests.embedder.queue.jetstream.test_queue import States, job, pull_until, queue_config, result
from tests.kafka.fixtures import unique_name

pytestmark = pytest.mark.slow  # starts servers

WAIT_S = 15.0
PROMPT_S = 0.5  # a refusal while the broker is unreachable takes no longer than this
# A watcher gone silent is replaced after one silence (SILENCE_S, 3 s) and a new watch;
# the client's own check would take 10 to 20 s.
HEARD_AGAIN_S = 8.0


@pytest.fixture
def config() -> JetStreamConfig:
    return queue_config(publish_timeout_s=0.5)


@pytest.fixture
def own_server() -> Iterator[NatsServer]:
    """A server of this test's own, to kill or freeze without touching the shared one."""
    with NatsServer() as server:
        yield server


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP takes effect as its threads next run)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@contextlib.asynccontextmanager
async def fleet(
    url: str, config: JetStreamConfig
) -> AsyncIterator[tuple[JetStreamSubmitter, JetStreamPuller, FleetLiveness]]:
    """A gateway's halves (submitter, fleet view) and one worker's (puller, heartbeat)."""
    async with contextlib.AsyncExitStack() as stack:
        submitter = JetStreamSubmitter(url=url, inbox=unique_name("inbox"), config=config)
        puller = JetStreamPuller(url=url, config=config)
        beat = WorkerLiveness(
            url=url, worker_id="w1", models=["alpha"], states=States(), config=config,
            interval_s=0.2,
        )  # fmt: skip
        view = FleetLiveness(url=url, config=config)
        for part in (submitter, puller, beat, view):
            await stack.enter_async_context(part)
        await eventually(lambda: view.state("alpha") == "ready", "the worker seen", WAIT_S)
        yield submitter, puller, view


async def test_a_deleted_liveness_bucket_is_made_again_and_the_workers_seen_again(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with fleet(nats_server.url, config) as (_, _, view):
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        try:
            await js.delete_key_value(config.workers_bucket)
            # The worker makes the bucket again and the gateway watches the new one: a
            # worker that starts only now is seen through it.
            later = WorkerLiveness(
                url=nats_server.url, worker_id="w2", models=["beta"], states=States(),
                config=config, interval_s=0.2,
            )  # fmt: skip
            async with later:
                await eventually(lambda: view.state("beta") == "ready", "the new one", WAIT_S)
            await js.key_value(config.workers_bucket)  # made again
            assert view.state("alpha") == "ready"  # the silence was the bucket's, not w1's
        finally:
            await nc.close()


async def test_a_watcher_whose_consumer_is_lost_hears_the_workers_again_promptly(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    """A clustered server that led the liveness bucket takes the gateway's watch consumer
    with it, while the bucket lives on in the other servers. The gateway must notice that
    the bucket holds word its watcher never delivered, not wait out the client's own
    heartbeat check (two 5 s heartbeats, and one try to make the consumer again)."""
    async with fleet(nats_server.url, config) as (_, _, view):
        nc = await nats.connect(nats_server.url)
        try:
            stream = f"KV_{config.workers_bucket}"
            for consumer in await nc.jsm().consumers_info(stream):
                await nc.jsm().delete_consumer(stream, consumer.name)
            later = WorkerLiveness(
                url=nats_server.url, worker_id="w2", models=["beta"], states=States(),
                config=config, interval_s=0.2,
            )  # fmt: skip
            async with later:
                await eventually(lambda: view.state("beta") == "ready", "w2 heard", HEARD_AGAIN_S)
            assert view.state("alpha") == "ready"
        finally:
            await nc.close()


async def test_a_killed_server_is_a_prompt_503_then_the_queue_is_whole_again(
    own_server: NatsServer, config: JetStreamConfig
) -> None:
    async with fleet(own_server.url, config) as (submitter, puller, view):
        held = await submitter.put(job("held"))  # pulled, answered only after the outage
        assert await pull_until(puller, 1) == ["held"]
        queued = await submitter.put(job("queued"))  # in the memory stream, lost with it
        own_server.kill()
        await eventually(lambda: not submitter._link.connected, "the loss noticed", WAIT_S)

        started = time.monotonic()
        with pytest.raises(NotReady, match="unreachable") as refused:
            await submitter.put(job("refused"))
        assert time.monotonic() - started < PROMPT_S
        assert refused.value.http_status == 503 and "Retry-After" in refused.value.headers
        started = time.monotonic()
        assert await puller.pull(["alpha"], 1_000, 0.2) == []  # no error, no busy loop
        assert time.monotonic() - started >= 0.15
        # The worker's beats expire from the view; the model then says why it is out.
        await eventually(lambda: view.state("alpha") == "loading", "the beats expired", WAIT_S)
        assert "unreachable" in str(view.describe("alpha")["reason"])

        own_server.restart()
        await eventually(lambda: view.state("alpha") == "ready", "the worker again", WAIT_S)
        # The gateway published what it waits for again, so the restarted (empty) stream
        # holds the queued job once more; the held one is answered by the worker holding it.
        assert await pull_until(puller, 1) == ["queued"]
        await puller.complete("held", result("held"))
        await puller.complete("queued", result("queued"))
        fresh = await submitter.put(job("fresh"))
        assert await pull_until(puller, 1) == ["fresh"]
        await puller.complete("fresh", result("fresh"))
        async with asyncio.timeout(WAIT_S):
            answers = [(await f).body for f in (held, queued, fresh)]
        assert answers == [b"held", b"queued", b"fresh"]
        # The core subscriptions came back with the client: a withdrawal still arrives.
        gone = await submitter.put(job("gone"))
        assert await pull_until(puller, 1) == ["gone"]
        gone.cancel()
        await eventually(lambda: puller.cancelled(["gone"]) == {"gone"}, "withdrawn", WAIT_S)
        assert submitter.depth() == {}
        nc = await nats.connect(own_server.url)
        try:
            js = nc.jetstream()
            await js.stream_info(config.dead_stream)  # made again too
            await js.consumer_info(config.stream, config.consumer("alpha"))
        finally:
            await nc.close()


async def test_a_stalled_server_is_a_503_within_the_publish_bound(
    own_server: NatsServer, config: JetStreamConfig
) -> None:
    async with JetStreamSubmitter(
        url=own_server.url, inbox=unique_name("inbox"), config=config
    ) as submitter:
        own_server.halt()  # frozen: the connection stays up, nothing is confirmed
        try:
            await eventually(lambda: stopped(own_server.pid), "the server frozen", WAIT_S)
            started = time.monotonic()
            with pytest.raises(NotReady, match="did not confirm") as refused:
                await submitter.put(job("stalled", deadline_in_s=30.0))
            took = time.monotonic() - started
        finally:
            own_server.resume()
        assert config.publish_timeout_s <= took < config.publish_timeout_s + 1.0
        assert "Retry-After" in refused.value.headers
        assert submitter.depth() == {}


async def test_a_worker_started_while_the_cluster_has_no_quorum_waits_then_pulls(
    nats_cluster: NatsCluster, config: JetStreamConfig
) -> None:
    """A server answers, but JetStream cannot (two of three nodes down): the start waits,
    and completes once the quorum is back, as an orchestrator's restarts expect."""
    config = config.model_copy(update={"storage": "file", "replicas": 3})
    nats_cluster.kill(1, 2)
    try:
        puller = JetStreamPuller(url=nats_cluster.nodes[0].url, config=config)
        starting = asyncio.ensure_future(puller.start())
        await asyncio.sleep(3.0)
        assert not starting.done()  # waiting, not failed
    finally:
        nats_cluster.restart(1, 2)
    async with asyncio.timeout(WAIT_S):
        await starting
    async with JetStreamSubmitter(
        url=nats_cluster.urls, inbox=unique_name("i"), config=config
    ) as s:
        answer = await s.put(job("after"))
        assert await pull_until(puller, 1) == ["after"]
        await puller.complete("after", result("done"))
        assert (await answer).body == b"done"
    await puller.stop()
