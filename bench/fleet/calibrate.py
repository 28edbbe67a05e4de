"""The calibration: what one more resident copy of each kind costs in memory, and what
each runtime's first load adds beyond its model (its libraries, imported and initialized
once per process, which no eviction gives back). From these the budget is chosen.

A server of its own, with no budget to speak of, loads one entry of each kind in turn, and
a second entry of the first kind of each runtime: the second copy's growth of the resident
set is the model's cost, the first copy's growth beyond it the runtime's. Growth is the
median resident set over half a second after the answer less that over half a second
before the request (``memory.level``): the load by a request of one text, as the host
measures a load (what the load added), so the budget is in the host's units. Each entry
then serves a batch of ``SERVE_TEXTS`` texts, and what that adds is reported beside it:
working memory, which the host's measure of a load does not see. The loads also build
what a first load of a kind builds once per machine (an ONNX export, an OpenVINO graph),
so the measured run times loads, not exports."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

import bench.fleet.state as state
from bench.fleet.fleetfile import Entry, Kind
from bench.fleet.server import Running

MB = 1024 * 1024
SETTLE_S = 0.3  # after an answer, before its level is read
SERVE_TEXTS = 32  # the batch each entry serves after its load: a full one under the load
WINDOW_S = 0.5
LARGEST_MARGIN = 1.5  # the budget holds the largest model with this much room: one load
# of it measured 14% above its calibration (e5 on ONNX Runtime, 805 and 921 MB), and the
# host counts memory beyond the models' measures against the budget too (other models'
# batches in flight, what evictions keep): about 150 MB when e5 came to load in a
# 12-entry run, a 1.3 margin's room short


@dataclass(frozen=True, slots=True)
class Measured:
    entry: Entry
    grew: int  # bytes the resident set grew by with the load
    serving: int  # and then with a batch served
    memory_bytes: int | None  # what the host measured for it (/v1/models)
    load_s: float | None  # the host's load seconds
    answered_s: float  # from the request to its answer

    @property
    def size(self) -> int:
        """What the load holds: the host's figure if it gave one, else the growth."""
        return max(self.memory_bytes or self.grew, 0)


def plan(kinds: Sequence[Kind]) -> list[Entry]:
    """The calibration's entries in load order: each kind once, and the first kind of each
    runtime twice in a row (its second copy has the runtime's libraries loaded already)."""
    out: list[Entry] = []
    runtimes: set[str] = set()
    for kind in dict.fromkeys(kinds):
        out.append(Entry(f"cal-{kind.tag}-1", kind))
        if kind.runtime not in runtimes:
            runtimes.add(kind.runtime)
            out.append(Entry(f"cal-{kind.tag}-2", kind))
    return out


def costs(measured: Sequence[Measured]) -> tuple[dict[Kind, int], dict[str, int]]:
    """(bytes per resident copy of each kind, bytes each runtime's libraries hold), from
    the loads of ``plan``: a kind measured twice costs its second copy. A load's size is
    the host's own figure when /v1/models gave one (the budget is counted in it), else
    the resident set's growth. The libraries are what the resident set grew by more on a
    runtime's first load than on its second: the host imports them before it measures a
    load, so its own figures leave them out."""
    per_kind: dict[Kind, int] = {}
    first: dict[str, Measured] = {}
    libraries: dict[str, int] = {}
    for m in measured:
        kind = m.entry.kind
        if kind not in per_kind:
            first.setdefault(kind.runtime, m)
            per_kind[kind] = m.size
        elif first.get(kind.runtime) is not None and first[kind.runtime].entry.kind == kind:
            per_kind[kind] = m.size
            libraries[kind.runtime] = max(first[kind.runtime].grew - m.grew, 0)
    return per_kind, libraries


def first_loads(measured: Sequence[Measured]) -> dict[str, int]:
    """What each runtime's first load held, libraries and model: the room a pinned entry
    of that runtime takes from a budget."""
    out: dict[str, int] = {}
    for m in measured:
        out.setdefault(m.entry.kind.runtime, m.size)
    return out


def choose_budget(entry_costs: Sequence[int], hold: float) -> int:
    """Bytes for ``hold`` models of the fleet's mean cost, and never less than the largest
    with room to spare: a budget it could not fit would fail that model on every load."""
    if not entry_costs:
        raise ValueError("no entry to size the budget for")
    return int(max(hold * statistics.fmean(entry_costs), LARGEST_MARGIN * max(entry_costs)))


async def measure(
    session: aiohttp.ClientSession, running: Running, entries: Sequence[Entry], texts: list[str]
) -> list[Measured]:
    """Each entry loaded by one request of one text, in turn, with its growth; then served
    a batch of ``texts``, with what that added (working memory: activations, a runtime's
    arena, kernels built for the new shapes)."""
    await asyncio.sleep(WINDOW_S + 0.1)  # a level before the first load
    out: list[Measured] = []
    for entry in entries:
        memory = running.memory
        before = memory.level(memory.now() - WINDOW_S)
        asked = memory.now()
        await _embed(session, running, entry, texts[:1])
        answered = memory.now()
        await asyncio.sleep(SETTLE_S + WINDOW_S)
        loaded = memory.level(answered + SETTLE_S)
        described = _described(await state.models(session, running.base), entry.name)
        await _embed(session, running, entry, texts)
        served = memory.now()
        await asyncio.sleep(SETTLE_S + WINDOW_S)
        serving = memory.level(served + SETTLE_S) - loaded
        out.append(
            Measured(
                entry,
                loaded - before,
                serving,
                described.get("memory_bytes"),
                described.get("load_s"),
                answered - asked,
            )
        )
        print(f"  {entry.name}: +{(loaded - before) / MB:.0f} MB in {answered - asked:.1f} s, "
              f"+{serving / MB:.0f} MB serving {len(texts)} texts", flush=True)  # fmt: skip
    return out


async def _embed(
    session: aiohttp.ClientSession, running: Running, entry: Entry, texts: list[str]
) -> None:
    body = {"model": entry.name, "input": texts, "encoding_format": "base64"}
    async with session.post(running.embeddings, json=body) as response:
        if response.status != 200:
            raise SystemExit(
                f"calibration: {entry.name} answered {response.status}: "
                f"{(await response.text())[:300]}"
            )


def _described(data: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    return next((m for m in data if m.get("id") == name), {})


def section(measured: Sequence[Measured]) -> dict[str, Any]:
    """The calibration as the JSON reports it."""
    per_kind, libraries = costs(measured)
    return {
        "loads": [
            {
                "entry": m.entry.name,
                "grew_mb": m.grew / MB,
                "serving_mb": m.serving / MB,
                "host_memory_mb": None if m.memory_bytes is None else m.memory_bytes / MB,
                "host_load_s": m.load_s,
                "answered_s": round(m.answered_s, 3),
            }
            for m in measured
        ],
        "cost_mb": {k.tag: v / MB for k, v in per_kind.items()},
        "libraries_mb": {r: v / MB for r, v in libraries.items()},
    }
