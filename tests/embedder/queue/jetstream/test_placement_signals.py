"""What a worker's placement reads from the real nats-server: the requests waiting for a
model it does not host yet, heartbeats that say what a worker could host (and say it at
once on ``announce``), and no request of a model a pull did not ask for."""

from __future__ import annotations

import asyncio

import pytest

from bench.services.nats import NatsServer
from embedder.core.jobs import Job, JobResult, ModelState
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.liveness import FleetLiveness, WorkerLiveness
from embedder.queue.jetstream.puller import JetStreamPuller
from tests.distributed.helpers import eventually
from tests.embedder.queue.jetstream.test_queue import WAIT_S, job, queue, queue_config, result


@pytest.fixture
def config() -> JetStreamConfig:
    return queue_config()


async def test_waiting_counts_a_model_no_worker_fetches_yet(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        answers = [await submitter.put(job(f"b{i}", model="beta")) for i in range(3)]
        assert await puller.waiting(["alpha", "beta"]) == {"alpha": 0, "beta": 3}
        taken: list[Job] = []
        async with asyncio.timeout(WAIT_S):
            while len(taken) < 3:
                taken += await puller.pull(["beta"], 1_000, 0.5)
        assert await puller.waiting(["beta"]) == {"beta": 3}  # in hand: not answered yet
        await puller.hand_back(taken[:1])  # back, waiting for redelivery: still counted
        assert await puller.waiting(["beta"]) == {"beta": 3}
        taken = taken[1:]
        async with asyncio.timeout(WAIT_S):
            while len(taken) < 3:
                taken += await puller.pull(["beta"], 1_000, 0.5)
        await answer(puller, taken, answers)

        async def none_left() -> bool:
            return await puller.waiting(["beta"]) == {"beta": 0}

        await eventually(none_left, "the answered requests to leave the count", WAIT_S)


async def test_a_pull_returns_only_the_models_it_asked_for(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        answers, taken = [], []
        for i in range(5):
            # An idle wait on both leaves fetches open; then beta is no longer asked for.
            taken += await puller.pull(["alpha", "beta"], 1_000, 0.05)
            answers.append(await submitter.put(job(f"b{i}", model="beta")))
            for _ in range(3):
                assert await puller.pull(["alpha"], 1_000, 0.1) == []
        async with asyncio.timeout(WAIT_S):
            while len(taken) < 5:
                taken += await puller.pull(["beta"], 1_000, 0.5)
        assert sorted(j.id for j in taken) == [f"b{i}" for i in range(5)]
        await answer(puller, taken, answers)


async def answer(
    puller: JetStreamPuller, jobs: list[Job], answers: list[asyncio.Future[JobResult]]
) -> None:
    for taken in jobs:
        await puller.complete(taken.id, result(taken.id))
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(*answers)


class Evicted:
    state_now: ModelState = "evicted"

    def state(self, model: str) -> ModelState:
        return self.state_now

    def describe(self, model: str) -> dict[str, object]:
        return {}


async def test_heartbeats_offer_what_a_worker_could_host_and_announce_at_once(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    states = Evicted()
    async with FleetLiveness(url=nats_server.url, config=config) as fleet:
        worker = WorkerLiveness(
            url=nats_server.url, worker_id="w1", models=["alpha", "huge"], states=states,
            config=config, interval_s=30.0, hosts=lambda: ["alpha"],
        )  # fmt: skip
        async with worker:
            await eventually(lambda: fleet.state("alpha") == "evicted", "alpha offered", WAIT_S)
            assert fleet.describe("alpha") == {"workers": 0, "hosts": 1}
            assert fleet.state("huge") == "failed"  # no worker can host it: 503 at once
            assert fleet.others("w1") == [] and len(fleet.others("w2")) == 1
            states.state_now = "ready"
            await worker.announce()  # long before the next beat, 30 s away
            await eventually(lambda: fleet.state("alpha") == "ready", "the announcement", 5.0)
