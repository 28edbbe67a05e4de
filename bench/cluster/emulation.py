"""The emulated cluster's devices: what each worker process is told to be.

A device profile is ``bench.cluster.cost_model``'s fit of a measured runtime (``cpu``:
this machine's runtime, ``calibrate``'s result or its fallback; ``gpu-like``: that fit
scaled, HYPOTHETICAL), times ``scale`` (every device slowed alike, so that the host path
of a 2-core machine can feed the whole emulated cluster), times each worker's own
``slowdown`` (heterogeneous devices). A worker reads it from its environment
(``embedder.runtimes.emulated``: ``FLOTILLA_EMULATED_*``).

Also here: which worker hosts which model (``hosting_map``), the fleet files that say so,
and the busy fraction arithmetic over two /metrics samples. All pure but the fleet files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from bench.cluster.cost_model import CostModel, gpu_like, load_cost

DEVICES = ("cpu", "gpu-like")
BUSY_METRIC = "flotilla_inference_seconds_sum"  # time in forward, summed over models


def device_cost(device: str, scale: float = 1.0) -> CostModel:
    """The cost model a ``device`` profile names, every cost times ``scale``."""
    if device not in DEVICES:
        raise ValueError(f"unknown device profile {device!r}; known: {', '.join(DEVICES)}")
    base = load_cost()
    cost = base if device == "cpu" else gpu_like(base)
    if scale == 1.0:
        return cost
    return replace(
        cost,
        label=f"{cost.label}, every cost x{scale:g}",
        fixed_s=cost.fixed_s * scale,
        per_token_s=cost.per_token_s * scale,
    )


@dataclass(frozen=True)
class Device:
    """One worker's emulated device."""

    cost: CostModel
    slowdown: float = 1.0

    def env(self) -> dict[str, str]:
        """What the worker process reads (``embedder.runtimes.emulated``)."""
        return {
            "FLOTILLA_EMULATED_FIXED_MS": f"{1e3 * self.cost.fixed_s:.6g}",
            "FLOTILLA_EMULATED_MS_PER_1K_TOKENS": f"{1e6 * self.cost.per_token_s:.6g}",
            "FLOTILLA_EMULATED_MS_PER_SEQUENCE": "0",
            "FLOTILLA_EMULATED_SLOWDOWN": f"{self.slowdown:g}",
        }

    def batch_s(self, lengths: Sequence[int]) -> float:
        return self.slowdown * self.cost.batch_s(lengths)


def slowdowns(workers: int, slow_share: float = 0.0, factor: float = 3.0) -> list[float]:
    """Each worker's slowdown: the last ``round(slow_share * workers)`` run ``factor``
    times slower (old devices), the others at 1."""
    if not 0.0 <= slow_share <= 1.0 or factor <= 0:
        raise ValueError("slow_share must be in [0, 1] and factor positive")
    slow = round(slow_share * workers)
    return [1.0] * (workers - slow) + [factor] * slow


def hosting_map(workers: int, models: Sequence[str], per_worker: int) -> dict[int, list[str]]:
    """Which models each worker hosts: ``per_worker`` consecutive models from a start
    that moves one model per worker, so every model is hosted by about
    ``workers * per_worker / len(models)`` workers and no two neighbours hold the same set."""
    if not models or not 1 <= per_worker <= len(models) or workers < 1:
        raise ValueError("need models, 1 <= per_worker <= len(models) and workers >= 1")
    n = len(models)
    return {w: [models[(w + k) % n] for k in range(per_worker)] for w in range(workers)}


def hosts_of(hosting: Mapping[int, Sequence[str]]) -> dict[str, list[int]]:
    """The inverse map: the workers that host each model."""
    out: dict[str, list[int]] = {}
    for worker, names in sorted(hosting.items()):
        for name in names:
            out.setdefault(name, []).append(worker)
    return out


def fleet_file(spec: Any, names: Sequence[str], path: Path) -> Path:
    """A fleet of ``names``, each ``spec`` (its tokenizer and profile) on the emulated
    device: models that cost the same, told apart by name only."""
    from bench.hostpath import emulated

    moved = emulated(spec)
    body = moved.model_dump(mode="json", exclude={"name", "aliases"}, exclude_unset=True)
    body["profiles"] = {k: p.model_dump(mode="json") for k, p in moved.profiles.items()}
    models = {n: dict(body) for n in names}  # copies: no YAML anchors
    path.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
    return path


def busy_fractions(before: Sequence[float], after: Sequence[float], wall_s: float) -> list[float]:
    """Each worker's device busy fraction over a run: its time in forward (the growth of
    ``flotilla_inference_seconds_sum``) over the run's wall time, at most 1."""
    if wall_s <= 0:
        raise ValueError("wall_s must be positive")
    return [min(1.0, max(0.0, (a - b) / wall_s)) for b, a in zip(before, after, strict=True)]


def forward_seconds(metrics_text: str) -> float:
    """Time in forward so far, summed over the worker's models, from its /metrics text."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(BUSY_METRIC + "{") or line.startswith(BUSY_METRIC + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
