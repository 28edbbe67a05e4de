"""A batch's spans: one root per batch linked to each traced request it serves; queue
and reply spans only for the jobs that carry a request's context (an untraced job, such
as ingest's, starts no trace of its own); an error's reply is marked failed."""

from __future__ import annotations

import time

from opentelemetry.trace import StatusCode

from embedder.core import tracing
from embedder.core.errors import InferenceFailed
from embedder.core.jobs import ApiShape, Job
from tests.tracing.spans import recorded

EXPECTED = (
    "POST /v1/embeddings",
    "flotilla.admission",
    "flotilla.batch",
    "flotilla.forward",
    "flotilla.queue",
    "flotilla.reply",
)


def a_job() -> Job:
    return Job.new(
        "m", ApiShape.OPENAI_EMBEDDINGS, b"{}", now=time.time(), timeout_s=5, bytes_per_token=4
    )


def test_a_batch_links_to_its_traced_requests_and_traces_only_their_jobs() -> None:
    with recorded() as exporter:
        with tracing.request("POST", "/v1/embeddings") as request:
            traced = tracing.enqueuing(a_job())
        untraced = a_job()
        batch = tracing.batch([traced, untraced])
        assert isinstance(batch, tracing.BatchTrace)
        with batch.forward(2):
            pass
        for job in (traced, untraced):
            with batch.reply(job, InferenceFailed("the model failed")):
                pass
        batch.end()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    names = sorted(s.name for s in exporter.get_finished_spans())
    # One queue and one reply span: the traced job's.
    assert names == sorted(EXPECTED)
    context = request.get_span_context()
    batch_span = spans["flotilla.batch"]
    assert [(link.context.trace_id, link.context.span_id) for link in batch_span.links] == [
        (context.trace_id, context.span_id)
    ]
    assert batch_span.attributes is not None and batch_span.attributes["flotilla.batch.jobs"] == 2
    reply = spans["flotilla.reply"]
    assert reply.context.trace_id == context.trace_id
    assert reply.status.status_code == StatusCode.ERROR
    assert reply.attributes is not None and reply.attributes["error.type"] == "inference_failed"
