"""What the simulation runs: the workloads, and what one worker sustains on each.

Workloads: ``small`` (1-3 inputs of 8-32 tokens), ``mixed`` (a heavy tail:
Pareto(1.2) inputs per request, at most 64, lengths drawn from bench.texts'
mix and cut at 256), ``bursty`` (small; on/off Poisson, exponential on and off
periods of one full-batch time on average, twice the mean rate when on) and
``multimodel`` (small, over 4 models of 48/24/16/12% popularity). Arrivals come
at an offered load, a fraction of the cluster's capacity: the request rate at
which every worker, forming full batches, is just busy all the time
(``capacity``, batching by ``fill``, the worker's own rule, which the engine
forms every batch by too).
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bench.cluster.cost_model import CostModel

WORKLOADS = ("small", "mixed", "bursty", "multimodel")
MODEL_MAX_TOKENS = 256  # all-MiniLM-L6-v2 truncates inputs here
# (share, shortest, longest) tokens per input for ``mixed``: bench.texts.LENGTH_MIX.
LENGTH_MIX: tuple[tuple[float, int, int], ...] = (
    (0.40, 8, 32),
    (0.30, 32, 128),
    (0.20, 128, 256),
    (0.10, 256, 512),
)
PARETO_ALPHA = 1.2  # inputs per ``mixed`` request: floor(Pareto(1.2)), at most 64
MAX_INPUTS = 64
MODEL_SHARES = (0.48, 0.24, 0.16, 0.12)  # ``multimodel``: Zipf popularity of 4 models
BURST_UNITS = 1.0  # ``bursty``: mean on and mean off period, in the workload's full-batch times
SCAN = 256  # requests a batch scans past the first that does not fit
SEED = 20261129


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, and unit-rate arrival instants to scale to a rate:
    every offered load sees the same requests (common random numbers)."""

    name: str
    models: list[int]
    tokens: list[int]
    lengths: list[tuple[int, ...]]  # tokens of each input
    unit_times: np.ndarray[Any, np.dtype[np.float64]]  # arrivals at 1 request/s
    n_models: int
    burst_s: float = 0.0  # mean on and off period of ``bursty``; 0 for plain Poisson
    seed: int = SEED

    def __len__(self) -> int:
        return len(self.tokens)

    def arrivals(self, rate: float) -> list[float]:
        """Arrival instants at ``rate`` requests/s (mean over on and off periods)."""
        if self.burst_s <= 0:
            plain: list[float] = (self.unit_times / rate).tolist()
            return plain
        # On/off: the same schedule of periods at every rate; arrivals come only in on
        # periods, at twice the mean rate. Time-change the unit-rate stream onto it.
        on_rate = 2.0 * rate
        need = float(self.unit_times[-1]) / on_rate
        rng = np.random.default_rng(self.seed + 7)
        periods = max(16, int(2 * need / self.burst_s) + 16)
        while True:
            durations = rng.exponential(self.burst_s, size=(periods, 2))  # (on, off)
            if durations[:, 0].sum() > need:
                break
            periods *= 2
        on_end_cum = np.cumsum(durations[:, 0])  # on-time elapsed at the end of period j
        on_start = np.concatenate([[0.0], np.cumsum(durations.sum(axis=1))[:-1]])
        x = self.unit_times / on_rate  # on-time elapsed at each arrival
        j = np.searchsorted(on_end_cum, x, side="left")
        before = np.concatenate([[0.0], on_end_cum[:-1]])[j]
        times: list[float] = (on_start[j] + (x - before)).tolist()
        return times


def make_workload(name: str, n: int, cost: CostModel, seed: int = SEED) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    rng = np.random.default_rng(zlib.crc32(name.encode()) + seed)
    if name == "mixed":
        counts = np.minimum(
            MAX_INPUTS, np.floor(rng.random(n) ** (-1.0 / PARETO_ALPHA)).astype(np.int64)
        )
        shares = np.array([s for s, _, _ in LENGTH_MIX])
        bands = rng.choice(len(LENGTH_MIX), size=int(counts.sum()), p=shares / shares.sum())
        low = np.array([lo for _, lo, _ in LENGTH_MIX])[bands]
        high = np.array([hi for _, _, hi in LENGTH_MIX])[bands]
        flat = np.minimum(MODEL_MAX_TOKENS, rng.integers(low, high + 1))
    else:  # 1-3 short inputs: queries, titles
        counts = rng.integers(1, 4, size=n)
        flat = rng.integers(8, 33, size=int(counts.sum()))
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    values = flat.tolist()
    lengths = [tuple(values[bounds[k] : bounds[k + 1]]) for k in range(n)]
    n_models = len(MODEL_SHARES) if name == "multimodel" else 1
    models = (
        rng.choice(n_models, size=n, p=np.array(MODEL_SHARES) / sum(MODEL_SHARES)).tolist()
        if n_models > 1
        else [0] * n
    )
    unit_times = np.cumsum(rng.exponential(1.0, size=n))
    workload = Workload(
        name, models, [sum(x) for x in lengths], lengths, unit_times, n_models, 0.0, seed
    )
    if name == "bursty":
        workload = replace(workload, burst_s=BURST_UNITS * capacity(workload, cost).batch_s)
    return workload


def fill(
    queue: deque[int], tokens: Sequence[int], max_tokens: int, max_requests: int
) -> tuple[list[int], int]:
    """form_batch's fill: requests in queue order up to the budget, skipping (at most
    ``SCAN``) those that do not fit; a request over the whole budget runs alone."""
    chosen: list[int] = []
    total = 0
    skipped: list[int] = []
    while queue and len(chosen) < max_requests:
        i = queue.popleft()
        k = tokens[i]
        if chosen and total + k > max_tokens:
            skipped.append(i)
            if len(skipped) >= SCAN:
                break
            continue
        chosen.append(i)
        total += k
        if total >= max_tokens:
            break
    if skipped:
        queue.extendleft(reversed(skipped))
    return chosen, total


@dataclass(frozen=True)
class Capacity:
    requests_per_s: float  # one worker, every batch full
    requests_per_batch: float
    batch_s: float  # a full batch's mean time: the workload's time unit


def capacity(workload: Workload, cost: CostModel) -> Capacity:
    """What one worker sustains on this workload when every batch is as full as the
    budget allows: the reference for offered load 1.0."""
    queue = deque(range(len(workload)))
    batches = 0
    seconds = 0.0
    while queue:
        chosen, _ = fill(queue, workload.tokens, cost.max_batch_tokens, cost.max_batch_requests)
        seconds += cost.batch_s([n for i in chosen for n in workload.lengths[i]])
        batches += 1
    return Capacity(len(workload) / seconds, len(workload) / batches, seconds / batches)
