"""Worker-side Prometheus metrics (the gateway exposes them on /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

BATCH_TOKENS = Histogram(
    "flotilla_batch_tokens", "Real tokens per executed batch.", ["model"], buckets=TOKEN_BUCKETS
)
BATCH_REQUESTS = Histogram(
    "flotilla_batch_requests",
    "Requests per executed batch.",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
INFERENCE_SECONDS = Histogram(
    "flotilla_inference_seconds", "Forward time per batch.", ["model"], buckets=SECONDS_BUCKETS
)
TOKENS = Counter("flotilla_tokens", "Tokens embedded or scored (rate() gives tok/s).", ["model"])
JOBS = Counter("flotilla_jobs", "Jobs finished by the worker, by outcome.", ["model", "outcome"])
BATCH_WAIT_SECONDS = Gauge(
    "flotilla_batch_wait_seconds",
    "How long a partial batch waits for company now: max_wait, or where the model has a "
    "latency target, the wait its controller steers toward it.",
    ["model"],
)
BATCH_BUDGET_TOKENS = Gauge(
    "flotilla_batch_budget_tokens",
    "Tokens a worker takes for one batch now: max_batch_tokens, or where the model has a "
    "latency target, what this device runs in half of it at its measured pace (never so "
    "little that the fixed cost per pass takes over a tenth of the device's time).",
    ["model"],
)
# Models loaded on demand and evicted under the memory budget (embedder.residency).
MODEL_LOADS = Counter(
    "flotilla_model_loads", "Model loads, by outcome (loaded, failed).", ["model", "outcome"]
)
MODEL_EVICTIONS = Counter(
    "flotilla_model_evictions", "Models unloaded to make room for another.", ["model"]
)
MODEL_LOAD_SECONDS = Counter(
    "flotilla_model_load_seconds", "Time spent loading each model (with _total: a sum).", ["model"]
)
MODEL_MEMORY_BYTES = Gauge(
    "flotilla_model_memory_bytes",
    "Memory a resident model holds, measured as it loaded (0 when not resident).",
    ["model"],
)
MEMORY_UNACCOUNTED_BYTES = Gauge(
    "flotilla_memory_unaccounted_bytes",
    "Memory the device holds beyond its models' measures and what the process held before "
    "them (what evictions left behind, working memory), as the last load or eviction saw "
    "it; it counts against --memory-budget-mb.",
)
