"""Closed-loop streaming clients and what one level of them measured.

``clients`` tasks share one counter of requests: each takes the next index,
sends ``PROMPTS[k % len]`` and, when its stream ends, takes the next, until
``requests`` are taken. Every side gets the same sequence of requests.
Output tokens/s is the sum of the streams' completion tokens over the
level's wall time (first send to last end).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench import report
from bench.generation.client import Stream, stream_once
from bench.generation.prompts import PROMPTS, Prompt, body


@dataclass(frozen=True)
class Target:
    """An OpenAI-compatible chat completions route and the model name it serves."""

    side: str  # the row's name
    url: str  # .../v1/chat/completions
    model: str


async def run_level(
    target: Target,
    clients: int,
    requests: int,
    timeout_s: float,
    prompts: Sequence[Prompt] = PROMPTS,
) -> list[Stream]:
    """``requests`` streamed requests from ``clients`` closed-loop clients, in the
    order they were taken."""
    counter = itertools.count()
    results: dict[int, Stream] = {}
    connector = aiohttp.TCPConnector(limit=clients)

    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            while (k := next(counter)) < requests:
                request = body(prompts[k % len(prompts)], target.model)
                results[k] = await stream_once(session, target.url, request, timeout_s)

        await asyncio.gather(*(client() for _ in range(clients)))
    return [results[k] for k in sorted(results)]


def summarize(streams: Sequence[Stream], clients: int) -> dict[str, Any]:
    """One level's row: throughput, TTFT and ITL percentiles (ms), errors."""
    ok = [s for s in streams if s.ok]
    errors = Counter((s.error or "").split(":", 1)[0] for s in streams if not s.ok)
    elapsed = (max(s.ended_s for s in streams) - min(s.sent_s for s in streams)) if streams else 0
    tokens = sum(s.output_tokens for s in ok)
    ttft = [1e3 * t for s in ok if (t := s.ttft_s) is not None]
    # The first wave is every client's first request at once: its TTFT measures a burst
    # (all prompts prefilled together); the rest arrive as streams end, the steady state.
    steady = [1e3 * t for s in streams[clients:] if s.ok and (t := s.ttft_s) is not None]
    gaps = [1e3 * g for s in ok for g in s.gaps_s]
    tpot = [1e3 * t for s in ok if (t := s.time_per_output_token_s) is not None]
    return {
        "clients": clients,
        "requests": len(streams),
        "ok": len(ok),
        "errors": dict(errors),
        "first_errors": [s.error for s in streams if not s.ok][:3],
        "elapsed_s": round(elapsed, 3),
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "mean_output_tokens": tokens / len(ok) if ok else float("nan"),
        "prompt_tokens_mean": _mean([s.prompt_tokens for s in ok if s.prompt_tokens is not None]),
        "usage_missing": sum(1 for s in ok if s.completion_tokens is None),
        "ttft_ms": {"p50": report.percentile(ttft, 50), "p99": report.percentile(ttft, 99)},
        "ttft_after_first_wave_ms": {
            "p50": report.percentile(steady, 50),
            "p99": report.percentile(steady, 99),
        },
        "itl_ms": {"p50": report.percentile(gaps, 50), "p99": report.percentile(gaps, 99)},
        "tpot_ms_mean": _mean(tpot),
        "latency_s_p50": report.percentile([s.ended_s - s.sent_s for s in ok], 50),
    }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
