"""The placement benchmark's load: open-loop requests (a fixed rate, whatever the
answers take) over a fleet whose popularity is Zipf-distributed and reshuffled every
phase, so that models cold a moment ago get a backlog; and what it measured, including
how long a model with a new backlog waited for a host (from the gateway's /v1/models)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench import report

POLL_S = 0.1  # how often the models' states are read from the gateway


def zipf_weights(n: int, s: float) -> list[float]:
    weights = [1.0 / (rank + 1) ** s for rank in range(n)]
    total = sum(weights)
    return [w / total for w in weights]


def schedule(
    models: Sequence[str], rate: float, phases: int, phase_s: float, s: float, seed: int
) -> list[tuple[float, str]]:
    """(seconds from the start, model) per request: Poisson arrivals at ``rate``, each
    phase's popularity a new permutation of the models under Zipf weights."""
    rng = random.Random(seed)
    weights = zipf_weights(len(models), s)
    plan: list[tuple[float, str]] = []
    for phase in range(phases):
        order = list(models)
        rng.shuffle(order)
        at = phase * phase_s
        while (at := at + rng.expovariate(rate)) < (phase + 1) * phase_s:
            plan.append((at, rng.choices(order, weights)[0]))
    return plan


@dataclass
class Measured:
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    host_waits_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    states: dict[str, str] = field(default_factory=dict)  # as last read
    _waiting_since: dict[str, float] = field(default_factory=dict)  # no host yet

    def summary(self) -> dict[str, Any]:
        ms = [s * 1e3 for s in self.latencies_s]
        ok = self.statuses["200"]
        waits = self.host_waits_s
        return {
            "requests": sum(self.statuses.values()),
            "ok": ok,
            "statuses": dict(self.statuses),
            "ok_per_s": ok / self.elapsed_s if self.elapsed_s else 0.0,
            "latency_ms": {f"p{p}": report.percentile(ms, p) for p in (50, 90, 99)} if ms else {},
            "host_wait_s": {
                "episodes": len(waits),
                "p50": report.percentile(waits, 50) if waits else None,
                "max": max(waits) if waits else None,
            },
        }

    def sent(self, model: str, now: float) -> None:
        """A request for a model no live worker serves opens a wait for its host."""
        if self.states.get(model) != "ready" and model not in self._waiting_since:
            self._waiting_since[model] = now

    def saw(self, states: dict[str, str], now: float) -> None:
        self.states = states
        for model, since in list(self._waiting_since.items()):
            if states.get(model) == "ready":
                self.host_waits_s.append(now - since)
                del self._waiting_since[model]


async def _poll(session: aiohttp.ClientSession, url: str, measured: Measured) -> None:
    while True:
        try:
            async with session.get(f"{url}/v1/models") as response:
                data = (await response.json())["data"]
            measured.saw({m["id"]: m["state"] for m in data}, time.monotonic())
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            print(f"models unreadable: {exc!r}")
        await asyncio.sleep(POLL_S)


async def _one(
    session: aiohttp.ClientSession, url: str, model: str, text: str, measured: Measured
) -> None:
    measured.sent(model, time.monotonic())
    started = time.perf_counter()
    body = {"model": model, "input": [text]}
    try:
        async with session.post(f"{url}/v1/embeddings", json=body) as response:
            await response.read()
            status = str(response.status)
    except (aiohttp.ClientError, TimeoutError) as exc:
        status = type(exc).__name__
    measured.statuses[status] += 1
    if status == "200":
        measured.latencies_s.append(time.perf_counter() - started)


async def run(url: str, plan: Sequence[tuple[float, str]], texts: Sequence[str]) -> Measured:
    """Send ``plan`` to the gateway at ``url``, each request at its time."""
    measured = Measured()
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        poller = asyncio.create_task(_poll(session, url, measured))
        await asyncio.sleep(2 * POLL_S)  # the states known before the first request
        started = time.monotonic()
        sending: list[asyncio.Task[None]] = []
        for i, (at, model) in enumerate(plan):
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            text = texts[i % len(texts)]
            sending.append(asyncio.create_task(_one(session, url, model, text, measured)))
        await asyncio.gather(*sending)
        measured.elapsed_s = time.monotonic() - started
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
    return measured
