"""A worker hosting several models on the real nats-server: it fetches from the model
with the most requests waiting, an idle pull waits on every model's consumer at once, a
request for one model is not held behind a fetch for another, what a fetch left open
brings while the worker is busy goes at once to a worker that asks, and no message a
fetch received is dropped on the way (which would strand it until ``ack_wait``)."""

from __future__ import annotations

import asyncio
import random
import time

import nats
import pytest

from bench.services.nats import NatsServer
from embedder.core.jobs import JobResult
from embedder.queue.jetstream import fetcher
from embedder.queue.jetstream.config import JetStreamConfig, Lane
from embedder.queue.jetstream.puller import JetStreamPuller
from embedder.queue.jetstream.streams import ensure_consumer
from tests.embedder.queue.jetstream.test_queue import WAIT_S, config, job, queue, result

pytestmark = pytest.mark.slow  # starts the server

__all__ = ["config"]  # the fixture, shared with the single-model tests

MODELS = ("alpha", "beta")
FETCH_TIMEOUT_S = 0.25  # what an idle worker's pull waits (embedder.serving.pulling.IDLE_POLL_S)


async def serve(puller: JetStreamPuller, stop: asyncio.Event) -> None:
    """A worker's loop, without the model: pull both models, answer at once."""
    while not stop.is_set():
        for j in await puller.pull(list(MODELS), 1_000, FETCH_TIMEOUT_S):
            await puller.complete(j.id, result(j.model))


async def test_a_request_for_either_model_is_answered_without_waiting_on_the_other(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        stop = asyncio.Event()
        serving = asyncio.create_task(serve(puller, stop))
        try:
            for model in (*MODELS, "beta", "alpha", "beta", "beta"):
                started = time.monotonic()
                future = await submitter.put(job(f"{model}-{started}", model=model))
                async with asyncio.timeout(WAIT_S):
                    assert (await future).body == model.encode()
                # Answered well within one fetch timeout, whichever model is asked and
                # whichever was asked before: a fetch for the other never stands in front.
                assert time.monotonic() - started < FETCH_TIMEOUT_S, model
        finally:
            stop.set()
            await serving


async def test_mixed_traffic_on_two_models_has_bounded_latency_and_nothing_stranded(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    rng = random.Random(3)
    async with queue(nats_server, config) as (submitter, [puller]):
        stop = asyncio.Event()
        serving = asyncio.create_task(serve(puller, stop))
        latencies: dict[str, list[float]] = {model: [] for model in MODELS}

        async def one(i: int, model: str) -> None:
            started = time.monotonic()
            future: asyncio.Future[JobResult] = await submitter.put(job(f"m{i}", model=model))
            async with asyncio.timeout(WAIT_S):
                assert (await future).body == model.encode()
            latencies[model].append(time.monotonic() - started)

        try:
            sent: list[asyncio.Task[None]] = []
            for i in range(300):
                # Bursts and lulls, mostly one model, now and then the other: the shape
                # in which a fetch for one model races a fetch for the other.
                model = MODELS[0] if rng.random() < 0.7 else MODELS[1]
                sent.append(asyncio.create_task(one(i, model)))
                await asyncio.sleep(rng.choice([0, 0, 0, 0.002, 0.01, 0.05]))
            await asyncio.gather(*sent)
        finally:
            stop.set()
            await serving
        worst = {model: max(values) for model, values in latencies.items()}
        print(f"\nworst latency per model: {worst}")
        assert sum(len(values) for values in latencies.values()) == 300
        # A message lost between a fetch and the worker comes back only after ack_wait
        # (2 s here); every request is answered well within one fetch timeout of arriving.
        for model, values in latencies.items():
            assert max(values) < 2 * FETCH_TIMEOUT_S, (model, sorted(values)[-5:])


async def test_a_long_fetch_for_one_model_does_not_hold_the_other_back(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config) as (submitter, [puller]):
        long_s = 3.0

        async def put_later(name: str, model: str) -> asyncio.Future[JobResult]:
            await asyncio.sleep(0.1)
            return await submitter.put(job(name, model=model))

        # Both consumers asked with a long timeout; a beta job ends the wait at once.
        putting = asyncio.create_task(put_later("b1", "beta"))
        started = time.monotonic()
        assert [j.id for j in await puller.pull(list(MODELS), 1_000, long_s)] == ["b1"]
        assert time.monotonic() - started < 0.1 + FETCH_TIMEOUT_S
        # alpha's request is still open on the server: an alpha job published now is
        # delivered to it, handed back at once (this worker is not pulling), and taken by
        # the next pull without waiting out anything.
        await submitter.put(job("a1", model="alpha"))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        assert [j.id for j in await puller.pull(list(MODELS), 1_000, long_s)] == ["a1"]
        assert time.monotonic() - started < FETCH_TIMEOUT_S
        for name in ("b1", "a1"):
            await puller.complete(name, result(name))
        async with asyncio.timeout(WAIT_S):
            assert (await (await putting)).body == b"b1"


async def test_the_model_with_more_requests_waiting_is_fetched_and_no_other(
    nats_server: NatsServer, config: JetStreamConfig
) -> None:
    async with queue(nats_server, config, workers=2) as (submitter, [puller, other]):
        for deep, shallow in [("beta", "alpha"), ("alpha", "beta")]:
            # A depth seen within DEPTH_FRESH_S stands for the present: let the last wane.
            await asyncio.sleep(2 * fetcher.DEPTH_FRESH_S)
            await submitter.put(job(f"{shallow}-x", model=shallow))
            for i in range(3):
                await submitter.put(job(f"{deep}-{i}", model=deep))
            first = await puller.pull(list(MODELS), 1_000, WAIT_S)
            assert sorted(j.id for j in first) == [f"{deep}-{i}" for i in range(3)]
            # Nothing was fetched from the other behind that pull: another worker has it
            # at once.
            async with asyncio.timeout(1.0):
                taken = await other.pull([shallow], 1_000, WAIT_S)
            assert [j.id for j in taken] == [f"{shallow}-x"]
            for j in [*first, *taken]:
                await (puller if j in first else other).complete(j.id, result(j.id))


async def test_a_busy_worker_keeps_nothing_a_fetch_left_open_brings(
    nats_server: NatsServer, config: JetStreamConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle pull on two models ends with an alpha job, beta's fetch left open. While
    the worker runs that batch (it does not pull again here), a request that fetch
    brings goes straight back to a worker that asks, even one delivered before, which
    would otherwise wait out the whole batch: never ``ack_wait``, never the next pull."""
    monkeypatch.setattr(fetcher, "IDLE_FETCH_S", 3.0)  # open through the steps below
    config = config.model_copy(update={"ack_wait_s": 60.0})
    async with queue(nats_server, config, workers=2) as (submitter, [busy, free]):
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        durable = await ensure_consumer(js, config, Lane("beta", 0))
        sub = await js.pull_subscribe_bind(durable=durable, stream=config.stream)
        await submitter.put(job("b", model="beta"))
        [fetched] = await sub.fetch(1, timeout=WAIT_S)  # held elsewhere: beta looks empty
        idle = asyncio.ensure_future(busy.pull(list(MODELS), 1_000, 3.0))
        await asyncio.sleep(0.2)
        await submitter.put(job("a", model="alpha"))
        assert [j.id for j in await idle] == ["a"]
        asking = asyncio.ensure_future(free.pull(["beta"], 1_000, WAIT_S))
        await asyncio.sleep(0.2)  # the busy worker's beta fetch is first in line
        await fetched.nak()  # its second delivery goes to that fetch
        async with asyncio.timeout(1.0):
            [b] = await asking
        assert (b.id, b.deliveries) == ("b", 3)  # through the busy worker, handed on
        await nc.close()
