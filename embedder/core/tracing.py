"""Traces of a request's path, through the OpenTelemetry API (never its SDK).

The spans, by process:

- gateway: ``flotilla.request`` (the HTTP request, kind SERVER) and under it
  ``flotilla.admission`` (read, annotate, admit: from its arrival to its enqueue);
- worker, in the request's trace: ``flotilla.queue`` (from the job's enqueue to the
  worker taking it into a batch) and ``flotilla.reply`` (its outcome sent back);
- worker, in a trace of its own: ``flotilla.batch`` (taken, run, delivered) and under it
  ``flotilla.forward`` (the runtime's call). A batch serves many requests, each with a
  trace of its own: one parent would put the batch into one request's trace and leave
  the others without it, so the batch span *links* to every request it serves, and each
  request's queue and reply spans link back to the batch;
- ingest: ``flotilla.ingest.record`` (a record's embedding and upsert, kind CONSUMER)
  under the producer's context when the record carries one.

A job carries its request's context as W3C trace-context headers (``Job.trace``: what the
propagator injects), which the JetStream wire copies into the message's headers, as a
producer's Kafka record carries them in its own.

Off (the default) the tracer is the API's no-op one, and every hook returns at its first
test or hands out one shared do-nothing context manager: no span, context or carrier is
made per request. ``flotilla.tracing`` turns it on with an SDK provider (``enable``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NoOpTracer, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import Attributes

from embedder.core.errors import FlotillaError

if TYPE_CHECKING:
    from embedder.core.jobs import Job

# What a job or a record carries of its request's context: W3C trace-context headers.
Carrier = tuple[tuple[str, str], ...]
TRACE_HEADERS = ("traceparent", "tracestate")

_NOOP: AbstractContextManager[Any] = contextlib.nullcontext()  # shared: reentrant, stateless


class _State:
    tracer: Tracer = NoOpTracer()
    on = False


def enable(tracer: Tracer) -> None:
    """Record spans with ``tracer`` (an SDK provider's) from now on."""
    _State.tracer, _State.on = tracer, True


def disable() -> None:
    _State.tracer, _State.on = NoOpTracer(), False


def on() -> bool:
    return _State.on


def carried(headers: Mapping[str, str]) -> Carrier:
    """The trace-context headers among ``headers`` (a message's), as a job carries them."""
    if TRACE_HEADERS[0] not in headers:  # untraced: no tuple made
        return ()
    return tuple((name, headers[name]) for name in TRACE_HEADERS if name in headers)


def _extract(carrier: Iterable[tuple[str, str]]) -> Context:
    from opentelemetry import propagate

    return propagate.extract(dict(carrier))


def _inject() -> Carrier:
    from opentelemetry import propagate

    headers: dict[str, str] = {}
    propagate.inject(headers)
    return carried(headers)


def _ns(wall_s: float, at_most: int) -> int:
    """A wall-clock time (``time.time()`` seconds) as a span time, never after ``at_most``."""
    return min(int(wall_s * 1e9), at_most)


# -- the gateway --------------------------------------------------------------------


def request(method: str, route: str) -> AbstractContextManager[Any]:
    """The request's span around the gateway's handling of it, current within."""
    if not _State.on:
        return _NOOP
    return _request(method, route)


@contextlib.contextmanager
def _request(method: str, route: str) -> Iterator[Span]:
    name = f"{method} {route}"
    attributes = {"http.request.method": method, "http.route": route}
    with _State.tracer.start_as_current_span(
        name, kind=SpanKind.SERVER, attributes=attributes, record_exception=False
    ) as span:
        try:
            yield span
        except FlotillaError as exc:
            span.set_attribute("http.response.status_code", exc.http_status)
            span.set_attribute("error.type", exc.code)
            if exc.http_status >= 500:
                span.set_status(Status(StatusCode.ERROR, exc.message))
            raise
        span.set_attribute("http.response.status_code", 200)


def enqueuing(job: Job) -> Job:
    """The job about to be enqueued, carrying the current (request's) context; records
    its admission, from the job's arrival until now."""
    if not _State.on:
        return job
    now = time.time_ns()
    current = trace.get_current_span()
    current.set_attributes(
        {"flotilla.model": job.model, "flotilla.job_id": job.id, "flotilla.tokens": job.est_tokens}
    )
    admission = _State.tracer.start_span(
        "flotilla.admission",
        start_time=_ns(job.enqueued_at, now),
        attributes={"flotilla.task": job.task},
    )
    admission.end(end_time=now)
    return replace(job, trace=_inject())


# -- the worker ---------------------------------------------------------------------


class BatchTrace:
    """One batch's span (its own trace, linked to every request it serves), the queue span
    of each of its jobs, and the spans of its forward pass and replies."""

    def __init__(self, jobs: Sequence[Job]) -> None:
        tracer = _State.tracer
        now = time.time_ns()
        # Only jobs that carry a request's context get spans of their own: one made here
        # for an untraced job (ingest's, a gateway's that does not trace) would be the
        # root of a trace nobody else writes to.
        self._parents = {job.id: _extract(job.trace) for job in jobs if job.trace}
        requests = [
            trace.get_current_span(ctx).get_span_context() for ctx in self._parents.values()
        ]
        self.span = tracer.start_span(
            "flotilla.batch",
            context=Context(),  # a root: the requests are links, not parents
            links=[Link(ctx) for ctx in requests if ctx.is_valid],
            start_time=now,
            attributes={
                "flotilla.model": jobs[0].model,
                "flotilla.batch.jobs": len(jobs),
                "flotilla.batch.tokens": sum(job.est_tokens for job in jobs),
            },
        )
        self._link = [Link(self.span.get_span_context())]
        for job in jobs:
            if job.id not in self._parents:
                continue
            queued = tracer.start_span(
                "flotilla.queue",
                context=self._parents[job.id],
                start_time=_ns(job.enqueued_at, now),
                links=self._link,
                attributes={"flotilla.job_id": job.id, "flotilla.deliveries": job.deliveries},
            )
            queued.end(end_time=now)

    @contextlib.contextmanager
    def forward(self, jobs: int) -> Iterator[None]:
        """The runtime's call for the ``jobs`` of the batch that reach it."""
        span = _State.tracer.start_span(
            "flotilla.forward",
            context=trace.set_span_in_context(self.span),
            attributes={"flotilla.forward.jobs": jobs},
        )
        try:
            yield
        finally:
            span.end()

    @contextlib.contextmanager
    def reply(self, job: Job, outcome: object) -> Iterator[None]:
        parent = self._parents.get(job.id)
        if parent is None:  # an untraced job
            yield
            return
        span = _State.tracer.start_span(
            "flotilla.reply", context=parent, kind=SpanKind.PRODUCER, links=self._link
        )
        if isinstance(outcome, FlotillaError):
            span.set_attribute("error.type", outcome.code)
            span.set_status(Status(StatusCode.ERROR, outcome.message))
        try:
            yield
        finally:
            span.end()

    def end(self) -> None:
        self.span.end()


class NoBatch:
    """A batch's trace while tracing is off: every hook does nothing, and is shared."""

    def forward(self, jobs: int) -> AbstractContextManager[Any]:
        return _NOOP

    def reply(self, job: Job, outcome: object) -> AbstractContextManager[Any]:
        return _NOOP

    def end(self) -> None:
        return None


NO_BATCH = NoBatch()
BatchSpans = BatchTrace | NoBatch  # what a batch carries through the worker's pipeline


def batch(jobs: Sequence[Job]) -> BatchSpans:
    """The trace of a batch (of one model) the worker has just taken to run."""
    if not _State.on or not jobs:
        return NO_BATCH
    return BatchTrace(jobs)


# -- ingest -------------------------------------------------------------------------


class IngestTrace:
    """A span for each record of a chunk that carries a producer's context (under that
    context), open while the chunk is embedded and written."""

    def __init__(self, records: Sequence[tuple[Sequence[tuple[str, bytes | None]], Attributes]]):
        self.spans: dict[int, Span] = {}
        for i, (headers, attributes) in enumerate(records):
            found = tuple(
                (name, value.decode("latin-1"))
                for name, value in headers
                if name in TRACE_HEADERS and value is not None
            )
            if found:
                self.spans[i] = _State.tracer.start_span(
                    "flotilla.ingest.record",
                    context=_extract(found),
                    kind=SpanKind.CONSUMER,
                    attributes=attributes,
                )

    def failed(self, index: int, reason: str) -> None:
        """The record at ``index`` went to the dead-letter topic for ``reason``."""
        if (span := self.spans.get(index)) is not None:
            span.set_status(Status(StatusCode.ERROR, reason))

    def end(self) -> None:
        for span in self.spans.values():
            span.end()


def ingest_records(
    records: Sequence[tuple[Sequence[tuple[str, bytes | None]], Attributes]],
) -> IngestTrace:
    """The spans of a chunk's records, by each record's headers and attributes; the
    caller asks only while ``on()``, so a chunk costs nothing while tracing is off."""
    return IngestTrace(records)
