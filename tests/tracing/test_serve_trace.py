"""One request through `flotilla serve` (its build_app under uvicorn: gateway, in-process
queue and worker in one process, the tiny model) is one trace: the gateway's request
span with its admission under it, and the worker's queue and reply spans under the
request; the batch is a trace of its own, linked to the request, its forward under it."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind

from flotilla.serve import build_app
from flotilla.settings import Settings
from tests.gateway.conftest import _free_port, hub_offline
from tests.ready import served_in_thread
from tests.tracing.spans import recorded

pytestmark = pytest.mark.slow


def ids(context: SpanContext | None) -> tuple[int, int]:
    """A span's identity, whichever process saw it (a link's context says it is remote)."""
    assert context is not None
    return context.trace_id, context.span_id


def by_name(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def wait_for(exporter: InMemorySpanExporter, name: str, timeout_s: float = 10.0) -> ReadableSpan:
    """The one finished span named ``name``: the batch ends after its replies are out,
    so shortly after the client has its answer."""
    deadline = time.monotonic() + timeout_s
    while not (found := by_name(exporter, name)):
        assert time.monotonic() < deadline, f"no {name} span within {timeout_s} s"
        time.sleep(0.02)
    assert len(found) == 1, found
    return found[0]


def test_one_request_is_one_trace_and_its_batch_links_to_it(
    tiny_fleet: Path, tmp_path: Path
) -> None:
    settings = Settings(
        fleet=tiny_fleet, data_dir=tmp_path / "data", model_cache_dir=tmp_path / "cache",
        device="cpu", threads=1, untuned="defaults",
    )  # fmt: skip
    app = build_app(settings)
    with (
        hub_offline(),
        served_in_thread(app, _free_port(), "traced") as url,
        recorded() as exporter,
    ):
        answer = httpx.post(f"{url}/v1/embeddings", json={"model": "tiny", "input": ["a", "b"]})
        assert answer.status_code == 200, answer.text
        batch = wait_for(exporter, "flotilla.batch")
    request = wait_for(exporter, "POST /v1/embeddings")
    admission, queued, reply, forward = (
        wait_for(exporter, name)
        for name in ("flotilla.admission", "flotilla.queue", "flotilla.reply", "flotilla.forward")
    )
    assert request.kind == SpanKind.SERVER and request.parent is None
    assert request.attributes is not None
    assert request.attributes["flotilla.job_id"] == answer.headers["x-request-id"]
    assert request.attributes["http.response.status_code"] == 200
    trace_id = request.context.trace_id
    for child in (admission, queued, reply):  # the request's trace, under its span
        assert child.context.trace_id == trace_id, child.name
        assert child.parent is not None and child.parent.span_id == request.context.span_id
    # The batch is a root of its own, linked to the request; queue and reply link back.
    assert batch.parent is None and batch.context.trace_id != trace_id
    assert [ids(link.context) for link in batch.links] == [ids(request.context)]
    for span in (queued, reply):
        assert [ids(link.context) for link in span.links] == [ids(batch.context)], span.name
    assert forward.parent is not None and forward.parent.span_id == batch.context.span_id
    assert batch.attributes is not None and batch.attributes["flotilla.batch.jobs"] == 1
    # The times line up: queued until the batch was taken, the forward inside the batch.
    times = [queued.end_time, batch.start_time, forward.start_time, forward.end_time]
    known = [t for t in [*times, batch.end_time] if t is not None]
    assert len(known) == 5 and known[0] == known[1]
    assert sorted(known) == known
