"""One request across processes: a `flotilla gateway` and a `flotilla worker` over the
real nats-server, both exporting to an OTLP/HTTP receiver here. The request's context
travels in the JetStream message's headers (traceparent), so the gateway's spans and
the worker's queue and reply spans share one trace id; the worker's batch links to the
gateway's request span."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from bench.services.nats import NatsServer
from tests.distributed.cluster import processes, start_cluster, wait_until_serving
from tests.kafka.fixtures import unique_name
from tests.tracing.spans import OtlpReceiver, ReceivedSpan, free_port

pytestmark = pytest.mark.slow

GATEWAY_SPANS = ("POST /v1/embeddings", "flotilla.admission")
WORKER_SPANS = ("flotilla.queue", "flotilla.batch", "flotilla.forward", "flotilla.reply")


async def spans_of(receiver: OtlpReceiver, timeout_s: float = 30.0) -> dict[str, ReceivedSpan]:
    """The one span of each name, once both processes have exported theirs."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = {name: receiver.named(name) for name in (*GATEWAY_SPANS, *WORKER_SPANS)}
        if all(found.values()):
            assert all(len(spans) == 1 for spans in found.values()), found
            return {name: spans[0] for name, spans in found.items()}
        missing = [name for name, spans in found.items() if not spans]
        assert time.monotonic() < deadline, f"no {missing} spans within {timeout_s} s"
        await asyncio.sleep(0.1)


async def test_one_request_is_one_trace_across_gateway_and_worker(
    tiny_fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within 0.1 s, not 5 s
    stream = unique_name("TRACED").replace("-", "_")
    port = free_port()
    # A server of its own: the suite's holds the liveness bucket made by earlier tests on
    # file storage, which this run's memory storage could not make again.
    with NatsServer() as nats_server, OtlpReceiver() as receiver, processes() as procs:
        shared = [
            "--nats", nats_server.url, "--fleet", str(tiny_fleet), "--nats-stream", stream,
            "--nats-subject-prefix", f"jobs.{stream}", "--nats-storage", "memory",
            "--log-level", "warning", "--otlp-endpoint", receiver.url,
        ]  # fmt: skip
        cluster = start_cluster(procs, shared, port, 1, tmp_path)
        await wait_until_serving(f"http://127.0.0.1:{port}", 1, procs)
        async with httpx.AsyncClient(timeout=30) as client:
            answer = await client.post(
                f"http://127.0.0.1:{port}/v1/embeddings",
                json={"model": "tiny", "input": ["across", "processes"]},
            )
        assert answer.status_code == 200, answer.text
        spans = await spans_of(receiver)
        assert cluster.gateway.proc.poll() is None
    request = spans["POST /v1/embeddings"]
    assert {spans[name].service for name in GATEWAY_SPANS} == {"flotilla-gateway"}
    assert {spans[name].service for name in WORKER_SPANS} == {"flotilla-worker"}
    # One trace across both processes: the worker's spans of the job under the request.
    for name in ("flotilla.admission", "flotilla.queue", "flotilla.reply"):
        assert spans[name].trace_id == request.trace_id, name
        assert spans[name].parent_id == request.span_id, name
    batch, forward = spans["flotilla.batch"], spans["flotilla.forward"]
    assert batch.parent_id == "" and batch.trace_id != request.trace_id
    assert batch.links == ((request.trace_id, request.span_id),)
    assert spans["flotilla.queue"].links == ((batch.trace_id, batch.span_id),)
    assert (forward.trace_id, forward.parent_id) == (batch.trace_id, batch.span_id)
