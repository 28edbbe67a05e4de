"""Exporting traces: with --otlp-endpoint, an OpenTelemetry SDK provider that batches
spans and posts them over OTLP/HTTP, behind the hooks of ``embedder.core.tracing``.

OTLP over HTTP (protobuf), not gRPC: the exporter needs no grpcio (a large native
wheel), and every collector that speaks OTLP (Jaeger, Tempo, the OTel Collector) takes
it on port 4318. Without the endpoint nothing here runs, and the SDK is never imported:
it is an optional dependency (the ``tracing`` extra).
"""

from __future__ import annotations

import atexit
import logging

from embedder.core import tracing
from embedder.core.errors import FlotillaError

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"


class TracingUnavailable(FlotillaError):
    code = "tracing_unavailable"


def traces_url(endpoint: str) -> str:
    """The collector's traces URL: ``endpoint`` as given when it names the path already,
    else with OTLP/HTTP's ``/v1/traces``."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def start(endpoint: str | None, service: str) -> None:
    """Record spans and export them to ``endpoint`` as ``service`` (flushed at exit);
    nothing at all without an endpoint."""
    if not endpoint:
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            f"--otlp-endpoint needs the OpenTelemetry SDK ({exc.name} is missing): install "
            "flotilla[tracing], or unset --otlp-endpoint (FLOTILLA_OTLP_ENDPOINT)"
        ) from None
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    # Batched off the request path, in the processor's own thread; a collector that is
    # down costs dropped spans (the queue is bounded), never a request's time.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(traces_url(endpoint))))
    tracing.enable(provider.get_tracer("flotilla"))
    atexit.register(provider.shutdown)  # the spans still queued go out before exit
    log.info("tracing: spans of %s go to %s", service, traces_url(endpoint))
