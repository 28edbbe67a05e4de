"""Each model's residency as the host keeps it, and the choice of what to evict: pure,
no clock or I/O of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from embedder.core.jobs import ModelState


@dataclass(slots=True)
class Residency:
    """One model on this device: whether it is resident, what it holds, when it was last
    asked for, and what loading it has cost."""

    name: str
    pinned: bool
    on_demand: bool
    state: ModelState = "evicted"
    memory_bytes: int | None = None  # measured at its last load; kept after eviction
    estimate_bytes: int | None = None  # its weights' size, before a first load measures it
    load_s: float | None = None  # the last load's seconds
    loading_since: float | None = None  # wall clock, while it loads
    last_used: float | None = None  # wall clock of its last request
    loads: int = 0
    evictions: int = 0
    freed_bytes: int | None = None  # what its last eviction handed back, measured
    load_peak_bytes: int | None = None  # the most its last load held at once, measured
    family: str = ""  # entries of the same weights, runtime and precision cost alike
    error: str | None = None  # why its last load failed
    failed_at: float | None = None

    @property
    def expected_bytes(self) -> int:
        return self.memory_bytes or self.estimate_bytes or 0

    @property
    def loading_bytes(self) -> int:
        """What it holds while it loads: its load's peak, where that was above its size."""
        return max(self.expected_bytes, self.load_peak_bytes or 0)

    def describe(self) -> dict[str, object]:
        """What ``/v1/models`` shows of it."""
        shown: dict[str, object] = {
            "load": "on_demand" if self.on_demand else "start",
            "pinned": self.pinned,
            "memory_bytes": self.memory_bytes if self.state == "ready" else 0,
            "last_used": self.last_used,
            "loads": self.loads,
            "evictions": self.evictions,
            "freed_bytes": self.freed_bytes,
            "load_peak_bytes": self.load_peak_bytes,
            "load_s": None if self.load_s is None else round(self.load_s, 3),
        }
        if self.memory_bytes is None and self.estimate_bytes is not None:
            shown["estimate_bytes"] = self.estimate_bytes
        if self.error is not None:
            shown["error"] = self.error
        return shown


def held_bytes(records: Iterable[Residency]) -> int:
    """What the resident models hold, and the loading ones will at their load's peak."""
    return sum(
        r.expected_bytes if r.state == "ready" else r.loading_bytes
        for r in records
        if r.state in ("ready", "loading")
    )


def evictable(
    records: Iterable[Residency], busy: Callable[[str], bool], *, loading: str
) -> list[Residency]:
    """The models an eviction may take: resident, not pinned, with no job in hand or
    waiting (``busy``), and not ``loading`` itself."""
    return [
        r
        for r in records
        if r.state == "ready" and not r.pinned and r.name != loading and not busy(r.name)
    ]


def victims(
    records: Iterable[Residency],
    need: int,
    budget: int,
    busy: Callable[[str], bool],
    *,
    loading: str,
) -> list[str] | None:
    """The least recently used resident models to evict so that ``need`` more bytes fit
    in ``budget``: never a pinned one, one with jobs in hand or waiting (``busy``), nor
    ``loading`` itself. [] when it fits already; None when evicting every candidate would
    not make it fit (then nothing should be evicted)."""
    records = list(records)
    over = held_bytes(records) + need - budget
    if over <= 0:
        return []
    candidates = sorted(
        evictable(records, busy, loading=loading), key=lambda r: (r.last_used or 0.0, r.name)
    )
    chosen: list[str] = []
    for record in candidates:
        chosen.append(record.name)
        over -= record.expected_bytes
        if over <= 0:
            return chosen
    return None
