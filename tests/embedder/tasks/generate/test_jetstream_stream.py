"""A streamed generation through the JetStream work queue (a real nats-server): the
engine pulls the job from the stream, its parts reach the gateway's inbox in order, and
together they are the text of the same request answered whole; a stream the gateway
withdraws stops on the worker."""

from __future__ import annotations

import asyncio
import json
import time

import orjson

from bench.services.nats import NatsServer
from embedder.core.jobs import ApiShape, Job, JobResult
from embedder.queue import Partial
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.puller import JetStreamPuller
from embedder.queue.jetstream.submitter import JetStreamSubmitter
from embedder.serving.turns import DeviceTurns
from embedder.tasks.generate.engine import GenerationEngine
from embedder.tasks.generate.runtime import GenerationRuntime
from tests.distributed.helpers import bounded
from tests.embedder.tasks.generate.conftest import tiny_spec
from tests.kafka.fixtures import unique_name


def completion(stream: bool, max_tokens: int = 12) -> Job:
    body = {"prompt": "the tenant", "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    return Job.new(
        "tiny-llm", ApiShape.OPENAI_COMPLETIONS, json.dumps(body).encode(),
        now=time.time(), timeout_s=30, bytes_per_token=4, est_tokens=8 + max_tokens,
    )  # fmt: skip


def texts(events: bytes) -> str:
    chunks = [line.removeprefix(b"data: ") for line in events.split(b"\n\n") if line]
    assert chunks[-1] == b"[DONE]"
    return "".join(orjson.loads(c)["choices"][0]["text"] for c in chunks[:-1])


async def test_parts_travel_the_gateway_inbox(
    nats_server: NatsServer, tiny_runtime: GenerationRuntime
) -> None:
    tag = unique_name("g").replace("-", "_").upper()
    config = JetStreamConfig(
        stream=f"JOBS_{tag}", subject_prefix=f"jobs.{tag}", storage="memory",
    )  # fmt: skip
    submitter = JetStreamSubmitter(url=nats_server.url, inbox=unique_name("inbox"), config=config)
    puller = JetStreamPuller(url=nats_server.url, config=config)
    async with (
        submitter,
        puller,
        GenerationEngine(puller, tiny_spec(), tiny_runtime, DeviceTurns()),
    ):
        whole: JobResult = await asyncio.wait_for(await submitter.put(completion(False)), 30)
        stream = await submitter.put_streaming(completion(True))
        parts: list[Partial] = []
        async with asyncio.timeout(30):
            while isinstance(event := await stream.next(), Partial):
                parts.append(event)
    assert len(parts) >= 2 and [p.seq for p in parts] == list(range(len(parts)))
    streamed = texts(b"".join(p.body for p in parts) + event.body)
    assert streamed == json.loads(whole.body)["choices"][0]["text"]


@bounded(120)  # it hung once (a 900 s suite timeout, on a loaded machine)
async def test_a_withdrawn_stream_stops_on_the_worker_and_is_not_redelivered(
    nats_server: NatsServer, tiny_runtime: GenerationRuntime
) -> None:
    """The gateway's client leaves after the first part: the worker holding the job, on
    another connection, stops the sequence within a few steps and acks the message."""
    tag = unique_name("w").replace("-", "_").upper()
    config = JetStreamConfig(
        stream=f"JOBS_{tag}", subject_prefix=f"jobs.{tag}", storage="memory",
        ack_wait_s=1.0,
    )  # fmt: skip
    submitter = JetStreamSubmitter(url=nats_server.url, inbox=unique_name("inbox"), config=config)
    puller = JetStreamPuller(url=nats_server.url, config=config)
    engine = GenerationEngine(puller, tiny_spec(), tiny_runtime, DeviceTurns())
    step = engine._decode

    def slow_step() -> int:  # a step as long as a real model's, so the stream is mid-way
        time.sleep(0.02)
        return step()

    engine._decode = slow_step  # type: ignore[method-assign]
    job = completion(True, max_tokens=200)
    async with submitter, puller, engine:
        stream = await submitter.put_streaming(job)
        async with asyncio.timeout(30):
            assert isinstance(await stream.next(), Partial)
        (sequence,) = engine.active
        stream.cancel()
        async with asyncio.timeout(10):
            while engine.active:  # noqa: ASYNC110 - the engine keeps no event for it
                await asyncio.sleep(0.01)
        assert sequence.finish == "cancelled"
        assert len(sequence.generated) < 20  # of 200: it stopped within a few steps
        await asyncio.sleep(1.5)  # past ack_wait: an unacked job would be back by now
        assert not engine.active and not engine.pulled
