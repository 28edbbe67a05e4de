"""The server's resident memory, sampled every 100 ms from ``/proc/<pid>/status``, and
the verdict on it: the most it held above its floor against the budget.

The sampler is a thread, not a task on the load's event loop: a loop busy with replies
would stretch the period exactly when memory moves (a load, an eviction).

The bound: the floor (the resident set once the server is ready, before any on-demand
load), plus the budget, plus the runtime libraries' own memory (what a runtime's first
load adds beyond the model: torch's and ONNX Runtime's code and pools, measured in the
calibration; no budget can evict them), plus a tolerance: ``tolerance_pct`` of the budget
(a forward pass's working memory, the allocator's slack) and ``tolerance_mb``."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MB = 1024 * 1024
PERIOD_S = 0.1


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float  # since the sampler started
    rss: int  # VmRSS, bytes
    anon: int  # RssAnon, bytes: the heap and the models' tensors, not mapped files


@dataclass(frozen=True, slots=True)
class Bound:
    floor: int  # bytes
    budget: int
    libraries: int
    tolerance_pct: float
    tolerance_mb: float

    @property
    def tolerance(self) -> int:
        return int(self.budget * self.tolerance_pct / 100 + self.tolerance_mb * MB)

    @property
    def limit(self) -> int:
        """The most the resident set may reach."""
        return self.floor + self.budget + self.libraries + self.tolerance


def read_status(pid: int) -> tuple[int, int] | None:
    """(VmRSS, RssAnon) of a process in bytes; None once it is gone."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon"):
                    found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    if "VmRSS" not in found:
        return None
    return found["VmRSS"], found.get("RssAnon", 0)


class Sampler:
    """Samples ``pid`` every ``period_s`` in a thread from ``start()`` to ``stop()``."""

    def __init__(self, pid: int, period_s: float = PERIOD_S) -> None:
        self.pid = pid
        self.period_s = period_s
        self.samples: list[Sample] = []
        self.started = time.monotonic()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def now(self) -> float:
        return time.monotonic() - self.started

    def start(self) -> Sampler:
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.samples

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        tick = time.monotonic()
        while not self._stopping.is_set():
            read = read_status(self.pid)
            if read is None:
                return
            self.samples.append(Sample(self.now(), *read))
            # On a fixed grid, so a slow read does not stretch every later period.
            tick += self.period_s
            self._stopping.wait(max(0.0, tick - time.monotonic()))

    def level(self, since_s: float, until_s: float | None = None) -> int:
        """The median resident set over [since_s, until_s): a level, not a spike."""
        return level(self.samples, since_s, until_s)


def level(samples: Sequence[Sample], since_s: float, until_s: float | None = None) -> int:
    chosen = [s.rss for s in samples if s.at_s >= since_s and (until_s is None or s.at_s < until_s)]
    if not chosen:
        raise ValueError(f"no memory sample in [{since_s:.1f}, {until_s}) s")
    return int(statistics.median(chosen))


def verdict(samples: Sequence[Sample], bound: Bound, since_s: float = 0.0) -> dict[str, Any]:
    """The peak over the run (from ``since_s``) against the bound, with the first and the
    count of the samples above it, and the largest gap between samples (the sampler's
    own health: a gap hides what happened in it)."""
    run = [s for s in samples if s.at_s >= since_s]
    if not run:
        raise ValueError("no memory sample during the run")
    peak = max(run, key=lambda s: s.rss)
    over = [s for s in run if s.rss > bound.limit]
    gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(run)]
    return {
        "samples": len(run),
        "period_s": PERIOD_S,
        "largest_gap_s": round(max(gaps), 3) if gaps else None,
        "floor_mb": bound.floor / MB,
        "budget_mb": bound.budget / MB,
        "libraries_mb": bound.libraries / MB,
        "tolerance": f"{bound.tolerance_pct:g}% of the budget + {bound.tolerance_mb:g} MB",
        "tolerance_mb": bound.tolerance / MB,
        "limit_mb": bound.limit / MB,
        "max_mb": peak.rss / MB,
        "max_at_s": round(peak.at_s, 2),
        "max_over_floor_mb": (peak.rss - bound.floor) / MB,
        "max_anon_mb": max(s.anon for s in run) / MB,
        "over_limit_samples": len(over),
        "first_over_at_s": round(over[0].at_s, 2) if over else None,
        "ok": not over,
    }
