"""Shared output helpers: where results go, what machine they came from, tables."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from embedder.core.device import SPEED_FLAGS, cpu_flags, cpu_model

RESULTS = Path(__file__).resolve().parent / "results"


def results_dir() -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS


def machine(threads: int) -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, threads and library versions."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_flags": sorted(cpu_flags() & set(SPEED_FLAGS)),
        "cores": os.cpu_count(),
        "threads": threads,
        "python": platform.python_version(),
    }
    for name in ("torch", "transformers", "sentence_transformers", "tokenizers"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        info[name] = getattr(module, "__version__", "?")
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


def write_json(name: str, data: dict[str, Any]) -> Path:
    path = results_dir() / name
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile, ``p`` in [0, 100]; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return float(ordered[rank])


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        all(isinstance(row[i], int | float) for row in rows) if rows else False
        for i in range(len(headers))
    ]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(row, widths, numeric, strict=True)
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])


def _cell(value: object) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# -- CPU accounting ----------------------------------------------------------
# On a shared machine other tenants' work slows every method; the benchmarks
# record how busy the CPUs were with work that was not theirs.


def _machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / tick, sum(values) / tick


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(roles: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far of each role's processes, summed per role."""
    return {role: sum(process_cpu_s(pid) for pid in pids) for role, pids in roles.items()}


class CpuMeter:
    """CPU use of the machine, of our processes and of everything else, over a span."""

    def __init__(self, pids: Sequence[int] = ()) -> None:
        self.pids = [os.getpid(), *pids]
        self._start = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        busy, total = _machine_cpu_s()
        return busy, total, sum(process_cpu_s(pid) for pid in self.pids)

    def result(self) -> dict[str, float]:
        busy, total, ours = self._sample()
        span = total - self._start[1]
        if span <= 0:
            return {}
        machine_busy = (busy - self._start[0]) / span
        ours_share = (ours - self._start[2]) / span
        return {
            "machine_busy_share": round(machine_busy, 3),
            "ours_share": round(ours_share, 3),
            "others_share": round(max(0.0, machine_busy - ours_share), 3),
        }


def wait_for_quiet(max_wait_s: float, threshold: float = 0.10, window_s: float = 3.0) -> float:
    """Wait until other processes use at most ``threshold`` of the CPU over a window,
    for up to ``max_wait_s``; returns their share over the last window."""
    deadline = time.monotonic() + max_wait_s
    while True:
        meter = CpuMeter()
        time.sleep(window_s)
        share = meter.result().get("others_share", 0.0)
        if share <= threshold or time.monotonic() >= deadline:
            return share
        print(f"  other processes use {100 * share:.0f}% of the CPU; waiting for quiet")


def levels(value: str) -> list[int]:
    """An argparse type: comma-separated positive integers (load levels)."""
    try:
        found = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers, got {value!r}") from None
    if not found or min(found) <= 0:
        raise argparse.ArgumentTypeError(f"positive integers, got {value!r}")
    return found


def sides_of(known: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated choice among a benchmark's ``known`` sides."""

    def sides(value: str) -> list[str]:
        chosen = [v.strip() for v in value.split(",") if v.strip()]
        if not chosen or any(s not in known for s in chosen):
            raise argparse.ArgumentTypeError(f"sides from {', '.join(known)}; got {value!r}")
        return chosen

    return sides
