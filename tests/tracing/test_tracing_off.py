"""Tracing off (no --otlp-endpoint) costs nothing: the SDK is never imported, the hooks
hand out shared no-ops and leave jobs as they are; on, a job's context rides its
JetStream message as a traceparent header. The exporter's URL and a missing SDK."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from embedder.core import tracing
from embedder.core.jobs import ApiShape, Job
from embedder.queue.jetstream import wire
from flotilla.settings import Settings
from flotilla.tracing import TracingUnavailable, start, traces_url
from flotilla.wiring import configure_tracing
from tests.tracing.spans import recorded

OFF_PROBE = """
import json, sys, time
from embedder.core import tracing
from embedder.core.jobs import Job
from flotilla import cli, serve, distributed  # every command that may start tracing
from flotilla.tracing import start

start(None, "flotilla-serve")
job = Job.new("m", "openai_embeddings", b"{}", now=time.time(), timeout_s=1, bytes_per_token=4)
print(json.dumps({
    "sdk": sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk")),
    "exporter": sorted(m for m in sys.modules if m.startswith("opentelemetry.exporter")),
    "job_untouched": tracing.enqueuing(job) is job,
    "shared_request": tracing.request("POST", "/a") is tracing.request("GET", "/b"),
    "shared_batch": tracing.batch([job]) is tracing.NO_BATCH,
}))
"""


def a_job() -> Job:
    return Job.new(
        "m", ApiShape.OPENAI_EMBEDDINGS, b"{}", now=time.time(), timeout_s=5, bytes_per_token=4
    )


def test_off_imports_no_sdk_and_the_hooks_make_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-c", OFF_PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "sdk": [],
        "exporter": [],
        "job_untouched": True,
        "shared_request": True,
        "shared_batch": True,
    }


def test_a_job_off_carries_no_context_and_its_message_no_traceparent() -> None:
    job = a_job()
    assert job.trace == ()
    headers = wire.encode_job(job, "replies.gw")
    assert not set(headers) & {"traceparent", "tracestate"}
    assert wire.decode_job(headers, job.body)[0].trace == ()


def test_a_traced_job_carries_its_context_through_its_message() -> None:
    with recorded() as exporter:
        with tracing.request("POST", "/v1/embeddings") as span:
            job = tracing.enqueuing(a_job())
        context = span.get_span_context()
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert dict(job.trace) == {"traceparent": traceparent}
    headers = wire.encode_job(job, "replies.gw")
    assert headers["traceparent"] == traceparent
    decoded, _ = wire.decode_job(headers, job.body)
    assert decoded.trace == job.trace
    names = {s.name for s in exporter.get_finished_spans()}
    assert names == {"POST /v1/embeddings", "flotilla.admission"}


def test_the_endpoint_names_the_otlp_traces_path_once() -> None:
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://c/v1/traces") == "https://c/v1/traces"


def test_an_endpoint_without_the_sdk_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    with pytest.raises(TracingUnavailable, match=r"flotilla\[tracing\]"):
        start("http://127.0.0.1:4318", "flotilla-serve")
    # A command ends with the message, not a traceback.
    settings = Settings(otlp_endpoint="http://127.0.0.1:4318")
    with pytest.raises(SystemExit, match=r"^error: --otlp-endpoint needs the OpenTelemetry SDK"):
        configure_tracing(settings, "flotilla-serve")
    assert not tracing.on()
