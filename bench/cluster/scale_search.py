"""The highest offered load a mode serves within the p99 target: the criterion, and the
bisection that searches for it (pure).

A load *meets the target* when, over its runs (one per seed), each latency class's median
p99 is within that class's own deadline (its multiple of the target: an interactive
request's is the target itself, a batch request's four times it) and at most
``MAX_ERROR_SHARE`` of the requests sent failed (504s past their deadline included). A p99
over every class together would hold batch requests to the interactive target, and count
against a scheduler exactly the deferral of batch work that their deadlines allow.

Each mode has its own ``Bisection`` over the offered load: it starts in the middle of
[``LOW``, ``HIGH``] (fractions of the cluster's capacity) and halves the interval a fixed
number of steps, so every mode gets the same number of runs and a resolution of
(HIGH - LOW) / 2**steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_ERROR_SHARE = 0.01
LOW, HIGH = 0.1, 1.5


def meets_target(
    runs: Sequence[dict[str, Any]], target_ms: float, of_target: Mapping[str, float]
) -> bool:
    """Whether these runs at one load (one per seed) met the target together;
    ``of_target``: each latency class's deadline in targets. A class none of whose
    requests was answered has no p99: its failures count in the errors."""
    if not runs:
        return False
    sent = sum(r["sent"] for r in runs)
    failed = sum(r["sent"] - r["ok"] for r in runs)
    if (failed / sent if sent else 1.0) > MAX_ERROR_SHARE:
        return False
    for name, times in of_target.items():
        p99s = class_p99s(runs, name)
        if p99s and statistics.median(p99s) > times * target_ms:
            return False
    return True


def class_p99s(runs: Sequence[dict[str, Any]], latency_class: str) -> list[float]:
    """The class's p99 in each run that answered some of its requests."""
    return [p for r in runs if (p := r["p99_ms_by_class"].get(latency_class)) is not None]


@dataclass
class Bisection:
    """One mode's search: ``load`` is the next load to run, ``record`` its verdict."""

    low: float = LOW
    high: float = HIGH
    best: float | None = None  # the highest load that met the target so far
    tried: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValueError("need 0 < low < high")

    @property
    def load(self) -> float:
        return (self.low + self.high) / 2

    def record(self, met: bool) -> None:
        load = self.load
        self.tried.append((load, met))
        if met:
            self.best = load if self.best is None else max(self.best, load)
            self.low = load
        else:
            self.high = load


def highest_met(
    loads: dict[float, list[dict[str, Any]]], target_ms: float, of_target: Mapping[str, float]
) -> float | None:
    """The highest load among those run whose runs met the target (None: none did)."""
    met = [load for load, runs in loads.items() if meets_target(runs, target_ms, of_target)]
    return max(met) if met else None
