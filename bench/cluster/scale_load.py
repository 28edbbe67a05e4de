"""The cluster-scale run's workloads as HTTP requests, and the open-loop client.

A workload is the simulation's requests (``bench.cluster.workloads``: the same request
sizes and unit-rate arrivals for a seed) with a real fleet's traffic on top
(``scale_traffic``: every request's deadline class, the model it asks for, its arrival
instant, its entry point):

- ``small``: 1-3 inputs of 8-32 tokens, every device alike;
- ``hetero``: the same requests on three generations of devices (``emulation.GENERATIONS``:
  half 1x, 30% 2x, 20% 4x slower);
- ``manymodels``: the same requests over ``MANY_MODELS`` models (m0..m15) of Zipf
  popularity whose ranking rotates every ``shift_s`` seconds; each worker hosts 2-4 of
  them (``HOSTED_PER_WORKER``), a router picks among the hosts;
- ``bursty``: the same requests in sharp bursts (``scale_traffic.burst_times``).

Texts are made of words that the MiniLM tokenizer keeps as one token each, so an input
of n tokens is n - 2 words ([CLS] and [SEP] count). Tokens served are what the answers
say (``usage.prompt_tokens``). The client is open loop: each request leaves at its
arrival instant whatever the answers before it did, so a slow path meets the same
load and queues; the run's latency is from that instant.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

import bench.cluster.scale_traffic as traffic
from bench.cluster.cost_model import CostModel
from bench.cluster.workloads import Workload, capacity, make_workload

WORKLOADS = ("small", "hetero", "manymodels", "bursty")
MANY_MODELS = tuple(f"m{i}" for i in range(16))  # the fleet's names; one emulated model
ONE_MODEL = ("m0",)
HOSTED_PER_WORKER = (4, 3, 4, 2)  # manymodels: models per worker, cycled over the workers
WORDS = (
    "the",
    "data",
    "model",
    "system",
    "time",
    "world",
    "water",
    "city",
    "house",
    "music",
    "school",
    "light",
    "market",
    "river",
    "paper",
    "energy",
)


def models_of(workload: str) -> tuple[str, ...]:
    """The fleet a workload asks for."""
    return MANY_MODELS if workload == "manymodels" else ONE_MODEL


def text_of(tokens: int, seed: int) -> str:
    """An input that tokenizes to ``tokens`` tokens (specials included)."""
    n = max(1, tokens - 2)
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n))


@dataclass(frozen=True)
class Send:
    """One request as the client sends it."""

    at_s: float  # after the run's start
    body: bytes
    entry: int  # which gateway or router
    deadline_ms: float
    latency_class: int


@dataclass(frozen=True)
class Requests:
    """A workload's requests for one seed; ``sends`` places them at an offered load."""

    name: str
    inputs: list[str]  # each request's "input" list, as JSON
    tokens: list[int]  # expected, [CLS]/[SEP] included
    workload: Workload
    ranks: list[int]  # popularity rank of each request's model
    classes: list[int]  # latency class of each request
    models: tuple[str, ...]
    seed: int
    shift_s: float = 0.0  # the popularity ranking rotates this often (0: never)
    burst_s: float = 0.0  # sharp bursts this long (0: Poisson arrivals)

    def arrivals(self, rate: float) -> list[float]:
        if self.burst_s > 0:
            times: list[float] = traffic.burst_times(
                self.workload.unit_times, rate, self.burst_s
            ).tolist()
            return times
        return self.workload.arrivals(rate)

    def sends(self, rate: float, duration_s: float, target_ms: float, gateways: int) -> list[Send]:
        """The requests that leave within ``duration_s`` at ``rate``/s."""
        times = [t for t in self.arrivals(rate) if t < duration_s]
        models = traffic.shifted_models(
            self.ranks[: len(times)], times, len(self.models), self.shift_s
        )
        entries = traffic.entry_points(len(times), gateways, self.seed)
        out = []
        for k, t in enumerate(times):
            cls = traffic.LATENCY_CLASSES[self.classes[k]]
            body = f'{{"model": "{self.models[models[k]]}", "input": {self.inputs[k]}}}'
            out.append(
                Send(
                    t,
                    body.encode(),
                    entries[k],
                    traffic.deadline_ms(cls, target_ms),
                    self.classes[k],
                )
            )
        return out


def build(
    name: str,
    n: int,
    cost: CostModel,
    seed: int,
    *,
    shift_s: float = 0.0,
    burst_s: float = 0.0,
) -> Requests:
    """``n`` requests of workload ``name``; ``shift_s`` and ``burst_s`` apply to
    ``manymodels`` and ``bursty`` only."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    workload = make_workload("small", n, cost, seed)
    models = models_of(name)
    inputs = [
        json.dumps([text_of(t, k + j) for j, t in enumerate(lengths)])
        for k, lengths in enumerate(workload.lengths)
    ]
    ranks = traffic.zipf_ranks(n, len(models), seed) if len(models) > 1 else [0] * n
    return Requests(
        name,
        inputs,
        list(workload.tokens),
        workload,
        ranks,
        traffic.latency_classes(n, seed),
        models,
        seed,
        shift_s if name == "manymodels" else 0.0,
        burst_s if name == "bursty" else 0.0,
    )


def cluster_rate(workload: Workload, cost: CostModel, slowdowns: Sequence[float]) -> float:
    """Requests/s the cluster sustains when every device forms full batches: offered
    load 1.0 (a device ``s`` times slower contributes ``1/s`` of one)."""
    one = capacity(workload, cost).requests_per_s
    return one * sum(1.0 / s for s in slowdowns)


@dataclass
class Outcome:
    latency_s: list[float] = field(default_factory=list)
    classes: list[int] = field(default_factory=list)  # each answered request's class
    tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    # Per latency class: requests sent and answered 504 (past their deadline).
    sent_by_class: list[int] = field(default_factory=lambda: [0] * len(traffic.LATENCY_CLASSES))
    late_by_class: list[int] = field(default_factory=lambda: [0] * len(traffic.LATENCY_CLASSES))
    started: float = 0.0
    last_done: float = 0.0

    def error(self, key: str) -> None:
        self.errors[key] = self.errors.get(key, 0) + 1


async def _one(
    session: aiohttp.ClientSession, url: str, send: Send, due: float, out: Outcome
) -> None:
    headers = {
        "content-type": "application/json",
        "x-request-timeout-ms": f"{send.deadline_ms:.0f}",
    }
    out.sent_by_class[send.latency_class] += 1
    try:
        async with session.post(url, data=send.body, headers=headers) as response:
            data = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        out.error(type(exc).__name__)
        return
    now = time.perf_counter()
    if status != 200:
        out.error(str(status))
        if status == 504:
            out.late_by_class[send.latency_class] += 1
        return
    out.latency_s.append(now - due)
    out.classes.append(send.latency_class)
    out.tokens += int(json.loads(data)["usage"]["prompt_tokens"])
    out.last_done = max(out.last_done, now)


async def open_loop(
    session: aiohttp.ClientSession,
    urls: Sequence[str],
    sends: Sequence[Send],
    duration_s: float,
) -> dict[str, Any]:
    """Send each request at its instant to its entry point's URL; wait for every answer."""
    out = Outcome(started=time.perf_counter())
    tasks: list[asyncio.Task[None]] = []
    for send in sends:
        due = out.started + send.at_s
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        url = urls[send.entry % len(urls)]
        tasks.append(asyncio.create_task(_one(session, url, send, due, out)))
    sent_s = time.perf_counter() - out.started
    await asyncio.gather(*tasks)
    return summarize(out, len(sends), max(duration_s, sent_s))


def summarize(out: Outcome, sent: int, span_s: float) -> dict[str, Any]:
    """Throughput over the sending span (answers that came later still count: an open
    loop run's throughput is what it served of what was offered), latency percentiles,
    and per latency class the share answered 504."""
    lat = np.asarray(out.latency_s) * 1e3 if out.latency_s else np.zeros(1)
    served_s = max(span_s, out.last_done - out.started) if out.latency_s else span_s
    return {
        "sent": sent,
        "ok": len(out.latency_s),
        "errors": out.errors,
        "error_share": (sent - len(out.latency_s)) / sent if sent else 0.0,
        "late_share_by_class": {
            c.name: (late / n if n else 0.0)
            for c, n, late in zip(
                traffic.LATENCY_CLASSES, out.sent_by_class, out.late_by_class, strict=True
            )
        },
        "p99_ms_by_class": _p99_by_class(out),
        "tokens": out.tokens,
        "tokens_per_s": out.tokens / served_s,
        "requests_per_s": len(out.latency_s) / served_s,
        "latency_ms": {q: float(np.percentile(lat, int(q[1:]))) for q in ("p50", "p90", "p99")},
        "served_s": served_s,
    }


def _p99_by_class(out: Outcome) -> dict[str, float | None]:
    """Each latency class's p99 over its answered requests (None: none answered)."""
    lat, classes = np.asarray(out.latency_s) * 1e3, np.asarray(out.classes)
    return {
        c.name: float(np.percentile(lat[classes == i], 99)) if np.any(classes == i) else None
        for i, c in enumerate(traffic.LATENCY_CLASSES)
    }
