"""The emulated cluster's devices: what each worker process is told to be.

A device profile is ``bench.cluster.cost_model``'s fit of a measured runtime (``cpu``:
this machine's runtime, ``calibrate``'s result or its fallback; ``gpu-like``: that fit
scaled, HYPOTHETICAL; ``gpu-fixed``: a GPU whose fixed cost per pass dominates, also
HYPOTHETICAL), times ``scale`` (every device slowed alike, so that the host path
of a 2-core machine can feed the whole emulated cluster), times each worker's own
``slowdown`` (heterogeneous devices: ``generations``). A worker reads it from its environment
(``embedder.tasks.embed.runtimes.emulated``: ``FLOTILLA_EMULATED_*``).

Also here: which worker hosts which model (``hosting_map``), the fleet files that say so,
and the busy fraction arithmetic over two /metrics samples. All pure but the fleet files.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from bench.cluster.cost_model import CostModel, gpu_fixed, gpu_like, load_cost

DEVICES = ("gpu-fixed", "cpu", "gpu-like")
_PROFILES: dict[str, Callable[[CostModel], CostModel]] = {
    "cpu": lambda base: base,
    "gpu-like": gpu_like,
    "gpu-fixed": gpu_fixed,
}
# Three device generations in one fleet: (slowdown, share of the workers). A fleet
# bought over years: half current, the rest one and two generations back.
GENERATIONS: tuple[tuple[float, float], ...] = ((1.0, 0.5), (2.0, 0.3), (4.0, 0.2))
_SPREAD = 0.6180339887  # the golden ratio's fraction: a low-discrepancy order of workers
BUSY_METRIC = "flotilla_inference_seconds_sum"  # time in forward, summed over models
# A device's batch budget: the fewest tokens at which a forward reaches this share of
# the device's peak throughput (the tuner's rule: the smallest budget close to the best).
KNEE_SHARE = 0.9
BUDGET_STEP = 64


def knee_tokens(cost: CostModel, share: float = KNEE_SHARE) -> int:
    """Tokens per forward at which ``fixed + per_token * t`` runs at ``share`` of the
    per-token peak: ``t >= share / (1 - share) * fixed / per_token``, in steps of 64.
    Past it a bigger batch gains little throughput and only holds more jobs on one
    device, where a shared queue would give them to another."""
    if not 0 < share < 1:
        raise ValueError("share must be in (0, 1)")
    tokens = share / (1 - share) * cost.fixed_s / cost.per_token_s
    return max(BUDGET_STEP, BUDGET_STEP * math.ceil(tokens / BUDGET_STEP))


def device_cost(device: str, scale: float = 1.0) -> CostModel:
    """The cost model a ``device`` profile names, every cost times ``scale``, its batch
    budget tuned to the device (``knee_tokens``, never above the measured profile's)."""
    if device not in DEVICES:
        raise ValueError(f"unknown device profile {device!r}; known: {', '.join(DEVICES)}")
    cost = _PROFILES[device](load_cost())
    budget = min(cost.max_batch_tokens, knee_tokens(cost))  # scale cancels out of the knee
    cost = replace(cost, max_batch_tokens=budget, forward_tokens=min(cost.forward_tokens, budget))
    if scale == 1.0:
        return cost
    return replace(
        cost,
        label=f"{cost.label}, every cost x{scale:g}",
        fixed_s=cost.fixed_s * scale,
        per_token_s=cost.per_token_s * scale,
        max_wait_s=cost.max_wait_s * scale,
        scale=scale,
    )


@dataclass(frozen=True)
class Device:
    """One worker's emulated device."""

    cost: CostModel
    slowdown: float = 1.0

    def env(self) -> dict[str, str]:
        """What the worker process reads (``embedder.tasks.embed.runtimes.emulated``)."""
        return {
            "FLOTILLA_EMULATED_FIXED_MS": f"{1e3 * self.cost.fixed_s:.6g}",
            "FLOTILLA_EMULATED_MS_PER_1K_TOKENS": f"{1e6 * self.cost.per_token_s:.6g}",
            "FLOTILLA_EMULATED_MS_PER_SEQUENCE": "0",
            "FLOTILLA_EMULATED_SLOWDOWN": f"{self.slowdown:g}",
        }

    def batch_s(self, lengths: Sequence[int]) -> float:
        return self.slowdown * self.cost.batch_s(lengths)


def generations(workers: int, mix: Sequence[tuple[float, float]] = GENERATIONS) -> list[float]:
    """Each worker's slowdown, ``mix`` giving (slowdown, share) per generation: counts by
    largest remainder, spread over the workers (a golden-ratio order) so that no run of
    neighbours, and so no model of ``hosting_map``, sits on one generation only."""
    shares = [share for _, share in mix]
    if workers < 1 or any(s < 0 for s in shares) or not math.isclose(sum(shares), 1.0):
        raise ValueError("need workers >= 1 and shares that sum to 1")
    exact = [workers * share for share in shares]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(mix)), key=lambda g: counts[g] - exact[g])
    for g in by_remainder[: workers - sum(counts)]:
        counts[g] += 1
    ordered = [slow for (slow, _), count in zip(mix, counts, strict=True) for _ in range(count)]
    order = sorted(range(workers), key=lambda w: (w * _SPREAD) % 1.0)
    out = [1.0] * workers
    for slot, worker in enumerate(order):
        out[worker] = ordered[slot]
    return out


def hosting_map(
    workers: int, models: Sequence[str], per_worker: int | Sequence[int]
) -> dict[int, list[str]]:
    """Which models each worker hosts. ``per_worker`` an int: that many consecutive models
    from a start that moves one model per worker, so every model is hosted by about
    ``workers * per_worker / len(models)`` workers and no two neighbours hold the same set.
    A sequence of sizes (cycled over the workers): consecutive models dealt out in turn,
    so every model is hosted once before any twice (all hosted once the sizes sum to at
    least ``len(models)``)."""
    n = len(models)
    sizes = [per_worker] if isinstance(per_worker, int) else list(per_worker)
    if not models or not sizes or not all(1 <= s <= n for s in sizes) or workers < 1:
        raise ValueError("need models, 1 <= per_worker <= len(models) and workers >= 1")
    if isinstance(per_worker, int):
        return {w: [models[(w + k) % n] for k in range(per_worker)] for w in range(workers)}
    out, start = {}, 0
    for w in range(workers):
        size = sizes[w % len(sizes)]
        out[w] = [models[(start + k) % n] for k in range(size)]
        start += size
    return out


def hosts_of(hosting: Mapping[int, Sequence[str]]) -> dict[str, list[int]]:
    """The inverse map: the workers that host each model."""
    out: dict[str, list[int]] = {}
    for worker, names in sorted(hosting.items()):
        for name in names:
            out.setdefault(name, []).append(worker)
    return out


def fleet_file(spec: Any, names: Sequence[str], path: Path, cost: CostModel) -> Path:
    """A fleet of ``names``, each ``spec`` (its tokenizer) on the emulated device with
    ``cost``'s batch limits: models that cost the same, told apart by name only. The
    latency target and the wait are in the device's time (times its ``scale``)."""
    from bench.hostpath import emulated

    moved = emulated(spec)
    body = moved.model_dump(mode="json", exclude={"name", "aliases"}, exclude_unset=True)
    body["profiles"] = {k: _limited(p, cost) for k, p in moved.profiles.items()}
    models = {n: copy.deepcopy(body) for n in names}  # copies: no YAML anchors
    path.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
    return path


def _limited(profile: Any, cost: CostModel) -> dict[str, Any]:
    target = profile.latency_target_ms
    dumped: dict[str, Any] = profile.model_dump(mode="json")
    return dumped | {
        "max_batch_tokens": cost.max_batch_tokens,
        "max_batch_requests": cost.max_batch_requests,
        "forward_tokens": cost.forward_tokens,
        "forward_max_sequences": cost.forward_max_sequences,
        "max_wait_ms": 1e3 * cost.max_wait_s,
        "latency_target_ms": None if target is None else target * cost.scale,
    }


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
