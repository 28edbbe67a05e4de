"""What the server says of its models: ``/v1/models`` polled through the run (state and
memory of each, so the report can show what was resident when), and after it the counts
of ``/metrics`` (loads by outcome, evictions, seconds spent loading). The parsing is
pure; the poller is a task beside the load."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

MB = 1024 * 1024
POLL_S = 1.0  # /v1/models is cheap, but not free on two cores: once a second
_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of ``name`` in a Prometheus text exposition: (labels, value)."""
    found: list[tuple[dict[str, str], float]] = []
    for line in text.splitlines():
        matched = _LINE.match(line.strip())
        if matched is None or matched.group(1) != name:
            continue
        labels = dict(_LABEL.findall(matched.group(2) or ""))
        found.append((labels, float(matched.group(3))))
    return found


def per_model(text: str, name: str, **where: str) -> dict[str, float]:
    """``name``'s samples summed by their ``model`` label, of those whose labels match."""
    out: dict[str, float] = {}
    for labels, value in metric(text, name):
        if "model" in labels and all(labels.get(k) == v for k, v in where.items()):
            out[labels["model"]] = out.get(labels["model"], 0.0) + value
    return out


def counters(metrics_text: str, models: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model: loads (and failed ones, and loads refused for want of room), evictions,
    seconds spent loading and their mean, from /metrics; the last load's seconds and the
    memory now, from /v1/models (``models``: its entries by id)."""
    loads = per_model(metrics_text, "flotilla_model_loads_total", outcome="loaded")
    failed = per_model(metrics_text, "flotilla_model_loads_total", outcome="failed")
    no_room = per_model(metrics_text, "flotilla_model_loads_total", outcome="no_room")
    evictions = per_model(metrics_text, "flotilla_model_evictions_total")
    seconds = per_model(metrics_text, "flotilla_model_load_seconds_total")
    out: dict[str, dict[str, Any]] = {}
    for name, entry in models.items():
        n = int(loads.get(name, 0))
        out[name] = {
            "loads": n,
            "failed_loads": int(failed.get(name, 0)),
            "no_room": int(no_room.get(name, 0)),
            "evictions": int(evictions.get(name, 0)),
            "load_s_total": seconds.get(name, 0.0),
            "mean_load_s": seconds.get(name, 0.0) / n if n else None,
            "last_load_s": entry.get("load_s"),
            "state": entry.get("state"),
        }
    return out


@dataclass(frozen=True, slots=True)
class Seen:
    """One poll of /v1/models: each model's state and memory."""

    at_s: float
    states: dict[str, str]
    memory: dict[str, int]  # bytes, as /v1/models says (0 when not resident)

    @property
    def held(self) -> int:
        return self.held_of(self.states)

    def held_of(self, models: Iterable[str]) -> int:
        """What ``models`` hold of it (the on-demand ones, say, without the pinned)."""
        return sum(self.memory.get(m, 0) for m in models if self.states.get(m) == "ready")

    @property
    def resident(self) -> list[str]:
        return [m for m, s in self.states.items() if s == "ready"]


def seen(at_s: float, data: Sequence[dict[str, Any]]) -> Seen:
    """A poll from /v1/models' ``data`` (adapters, listed with a parent, left out)."""
    models = [m for m in data if "parent" not in m]
    return Seen(
        at_s,
        {str(m["id"]): str(m.get("state")) for m in models},
        {str(m["id"]): int(m.get("memory_bytes") or 0) for m in models},
    )


def largest_memory(polls: Sequence[Seen]) -> dict[str, int]:
    """Each model's largest memory while resident, over the polls."""
    out: dict[str, int] = {}
    for poll in polls:
        for model, size in poll.memory.items():
            out[model] = max(out.get(model, 0), size)
    return out


async def models(session: aiohttp.ClientSession, base: str) -> list[dict[str, Any]]:
    async with session.get(f"{base}/v1/models") as response:
        response.raise_for_status()
        data: list[dict[str, Any]] = (await response.json())["data"]
    return data


async def metrics_text(session: aiohttp.ClientSession, base: str) -> str:
    async with session.get(f"{base}/metrics") as response:
        response.raise_for_status()
        return await response.text()


async def after_run(
    session: aiohttp.ClientSession, base: str
) -> tuple[str, list[dict[str, Any]], list[str]]:
    """/metrics and /v1/models once the load is over, and what could not be read (a
    server that stopped answering is a finding for the report, not a crash of it)."""
    unread: list[str] = []
    metrics, data = "", []
    try:
        metrics = await metrics_text(session, base)
    except (aiohttp.ClientError, TimeoutError) as exc:
        unread.append(f"/metrics: {type(exc).__name__} {exc}".strip())
    try:
        data = await models(session, base)
    except (aiohttp.ClientError, TimeoutError) as exc:
        unread.append(f"/v1/models: {type(exc).__name__} {exc}".strip())
    return metrics, data, unread


class Poller:
    """/v1/models every ``POLL_S`` until ``stop()``; times from ``started``."""

    def __init__(self, session: aiohttp.ClientSession, base: str, started: float) -> None:
        self.session, self.base, self.started = session, base, started
        self.polls: list[Seen] = []
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> list[Seen]:
        while not self._stopping.is_set():
            # A poll that fails (the server busy past the timeout) is a gap, not an end.
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                data = await models(self.session, self.base)
                self.polls.append(seen(time.monotonic() - self.started, data))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):
                    await self._stopping.wait()
        return self.polls
