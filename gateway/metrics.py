"""Gateway-side Prometheus metrics; /metrics also carries the worker's."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUEST_SECONDS = Histogram(
    "flotilla_request_seconds",
    "End-to-end request latency at the gateway.",
    ["model", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUEUE_SECONDS = Histogram(
    "flotilla_queue_seconds",
    "Time a request waited in the shared queue before its batch ran.",
    ["model"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
REQUESTS = Counter(
    "flotilla_requests", "Requests answered, by status.", ["model", "route", "status"]
)
INFLIGHT_TOKENS = Gauge("flotilla_inflight_tokens", "Estimated tokens admitted.", ["model"])
QUEUE_DEPTH = Gauge("flotilla_queue_depth", "Jobs waiting in the shared queue.", ["model"])
