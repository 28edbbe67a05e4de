"""Deadline lanes on the real nats-server: each request goes to the lane of its time
budget, a worker takes the urgent lanes' requests before a backlog of requests that
can wait (topping its batch up from the model's next lanes), the count a worker's
placement reads covers every lane, and a gateway does not count on workers that pull
fewer lanes than it sends to."""

from __future__ import annotations

import asyncio

import pytest

from bench.services.nats import NatsServer
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.liveness import FleetLiveness, WorkerLiveness
from tests.distributed.helpers import eventually
from tests.embedder.queue.jetstream.test_queue import (
    States,
    job,
    queue,
    queue_config,
    result,
)

pytestmark = pytest.mark.slow  # a real server

WAIT_S = 15.0


@pytest.mark.parametrize("lanes", [(2000, 8000), ()], ids=["lanes", "no-lanes"])
async def test_urgent_requests_pass_a_backlog_that_can_wait(
    nats_server: NatsServer, lanes: tuple[int, ...]
) -> None:
    config = queue_config(deadline_lanes_ms=lanes)
    async with queue(nats_server, config) as (submitter, [puller]):
        answers = [await submitter.put(job(f"b{i:02}", deadline_in_s=30.0)) for i in range(30)]
        answers.append(await submitter.put(job("s", deadline_in_s=5.0)))
        answers += [await submitter.put(job(f"u{i}", deadline_in_s=1.5)) for i in range(2)]
        assert await puller.waiting(["alpha"]) == {"alpha": 33}
        taken = await puller.pull(["alpha"], 1_000, 0.5)  # room for 15 of 64-token guesses
        ids = [j.id for j in taken]
        if lanes:  # the urgent, then the standard, then the backlog fills the batch
            assert ids[:3] == ["u0", "u1", "s"] and len(ids) == 15
        else:  # one queue in arrival order: the first fetched are the oldest
            assert not {"u0", "u1", "s"} & set(ids)
        async with asyncio.timeout(WAIT_S):
            while len(taken) < 33:
                taken += await puller.pull(["alpha"], 1_000, 0.5)
        for j in taken:
            await puller.complete(j.id, result(j.id))
        async with asyncio.timeout(WAIT_S):
            assert [(await a).body.decode() for a in answers][-3:] == ["s", "u0", "u1"]

        async def answered() -> bool:  # an ack is not confirmed: the count follows it soon
            return await puller.waiting(["alpha"]) == {"alpha": 0}

        await eventually(answered, "every request acknowledged", WAIT_S)


def test_lane_bounds_must_rise_and_be_positive() -> None:
    for wrong in ("8000,2000", "0,2000", "2000,2000", "soon"):
        with pytest.raises(ValueError, match="deadline_lanes_ms"):
            JetStreamConfig.model_validate({"nats_deadline_lanes_ms": wrong})


async def test_a_gateway_counts_only_workers_that_read_every_lane_it_sends_to(
    nats_server: NatsServer,
) -> None:
    gateway = queue_config(deadline_lanes_ms=(2000, 8000))
    fewer = WorkerLiveness(
        url=nats_server.url, worker_id="w-one-lane", models=["alpha"], states=States(),
        config=gateway.model_copy(update={"deadline_lanes_ms": (5000,)}), interval_s=0.2,
    )  # fmt: skip
    async with FleetLiveness(url=nats_server.url, config=gateway) as fleet, fewer:

        def reason() -> str:
            return str(fleet.describe("alpha").get("reason"))

        await eventually(lambda: "deadline lane" in reason(), "the worker heard", WAIT_S)
        assert fleet.state("alpha") == "loading"  # its 503 says why, and what to set
        why = reason()
        assert "pull 1 deadline lane(s) [5000] ms, fewer than this gateway's 2" in why
        assert "--nats-deadline-lanes-ms" in why
        # A gateway with fewer lanes sends only to subjects the worker reads.
        one = gateway.model_copy(update={"deadline_lanes_ms": ()})
        async with FleetLiveness(url=nats_server.url, config=one) as plain:
            await eventually(lambda: plain.state("alpha") == "ready", "served", WAIT_S)
        # As many lanes with other bounds only sort requests differently: served.
        other = WorkerLiveness(
            url=nats_server.url, worker_id="w-two-lanes", models=["alpha"], states=States(),
            config=gateway.model_copy(update={"deadline_lanes_ms": (1000, 4000)}),
            interval_s=0.2,
        )  # fmt: skip
        async with other:
            await eventually(lambda: fleet.state("alpha") == "ready", "served", WAIT_S)
            assert fleet.describe("alpha")["workers"] == 1
