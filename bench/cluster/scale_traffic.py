"""What each request of a cluster-scale run asks for and when it leaves: the conditions
of a real fleet's traffic, as pure seeded functions (the same requests at every offered
load and in every mode, so that modes differ only in how they serve them).

- Deadlines (``LATENCY_CLASSES``): each request belongs to a latency class and sends
  ``x-request-timeout-ms`` of that class's multiple of the p99 target; a request not
  answered by then is answered 504 and counts as an error.
- Popularity (``shifted_models``): a request's model is drawn by Zipf rank, and the
  ranking rotates every ``shift_s`` seconds, by ``ROTATE_STEP`` models so that the
  popular models move to other hosts (consecutive models share hosts in ``hosting_map``).
- Bursts (``burst_times``): periods of ``BURST_FACTOR`` times the mean rate, each shorter
  than the p99 target, between quiet periods at ``QUIET_SHARE`` of it, the mean rate
  being the offered load.
- Entry points (``entry_points``): with K gateways (pull) or K routers (push) each request
  goes to one of them, drawn by seed, as a load balancer in front of replicas spreads them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.float64]]


@dataclass(frozen=True)
class LatencyClass:
    name: str
    share: float  # of the requests
    of_target: float  # its deadline, in p99 targets


# A class's deadline is its p99 target too (scale_search.meets_target): a run that meets
# it sees at most ~1% of the class time out, so the error criterion and the p99 agree.
LATENCY_CLASSES = (
    LatencyClass("interactive", 0.5, 1.0),
    LatencyClass("standard", 0.3, 2.0),
    LatencyClass("batch", 0.2, 4.0),
)
OF_TARGET = {c.name: c.of_target for c in LATENCY_CLASSES}

ZIPF_S = 1.0  # popularity of the rank-r model ~ 1 / r**ZIPF_S
ROTATE_STEP = 5  # coprime with 16: every model takes each rank in turn
BURST_FACTOR = 6.0  # a burst's rate, in mean rates (5-10x)
QUIET_SHARE = 0.2  # the quiet periods' rate, in mean rates
BURST_OF_TARGET = 0.25  # a burst's length, in p99 targets: shorter than the budget


def lane_bounds_ms(target_ms: float) -> list[int]:
    """Deadline lanes for pull's queue, one per latency class: each bound halfway (by
    ratio) between two classes' deadlines, so a class's requests share a lane."""
    deadlines = sorted(c.of_target * target_ms for c in LATENCY_CLASSES)
    return [round(math.sqrt(a * b)) for a, b in itertools.pairwise(deadlines)]


def latency_classes(
    n: int, seed: int, classes: Sequence[LatencyClass] = LATENCY_CLASSES
) -> list[int]:
    """Each request's class (an index into ``classes``), drawn by share."""
    shares = np.array([c.share for c in classes])
    rng = np.random.default_rng(seed + 11)
    drawn: list[int] = rng.choice(len(classes), size=n, p=shares / shares.sum()).tolist()
    return drawn


def deadline_ms(latency_class: LatencyClass, target_ms: float) -> float:
    return latency_class.of_target * target_ms


def zipf_shares(n_models: int, s: float = ZIPF_S) -> FloatArray:
    weights = 1.0 / np.arange(1, n_models + 1) ** s
    shares: FloatArray = weights / weights.sum()
    return shares


def zipf_ranks(n: int, n_models: int, seed: int, s: float = ZIPF_S) -> list[int]:
    """Each request's popularity rank (0: the most popular model)."""
    rng = np.random.default_rng(seed + 13)
    ranks: list[int] = rng.choice(n_models, size=n, p=zipf_shares(n_models, s)).tolist()
    return ranks


def shifted_models(
    ranks: Sequence[int], times: Sequence[float], n_models: int, shift_s: float
) -> list[int]:
    """The model each request asks for: rank r is model r in the first ``shift_s``
    seconds, then ``r + ROTATE_STEP``, and so on (mod ``n_models``). ``shift_s`` 0: the
    ranking never moves."""
    if shift_s <= 0:
        return [r % n_models for r in ranks]
    epochs = np.floor(np.asarray(times) / shift_s).astype(np.int64)
    models: list[int] = ((np.asarray(ranks) + ROTATE_STEP * epochs) % n_models).tolist()
    return models


def burst_times(
    unit_times: FloatArray,
    rate: float,
    burst_s: float,
    factor: float = BURST_FACTOR,
    quiet: float = QUIET_SHARE,
) -> FloatArray:
    """Arrival instants at a mean of ``rate``/s: each period a quiet stretch at
    ``quiet * rate`` then a burst of ``burst_s`` at ``factor * rate``. The quiet stretch
    lasts ``burst_s * (factor - 1) / (1 - quiet)``, which makes the mean ``rate``. The
    unit-rate stream is time-changed onto that rate, so every load sees the same
    requests in the same order."""
    if not (factor > 1 and 0 < quiet < 1 and burst_s > 0 and rate > 0):
        raise ValueError("need factor > 1, 0 < quiet < 1, burst_s > 0 and rate > 0")
    quiet_s = burst_s * (factor - 1) / (1 - quiet)
    period = quiet_s + burst_s
    per_period = rate * period  # arrivals of the unit stream in one period
    x = np.asarray(unit_times, dtype=np.float64)
    k = np.floor(x / per_period)
    rem = x - k * per_period
    in_quiet = quiet * rate * quiet_s
    times: FloatArray = k * period + np.where(
        rem < in_quiet,
        rem / (quiet * rate),
        quiet_s + (rem - in_quiet) / (factor * rate),
    )
    return times


def entry_points(n: int, k: int, seed: int) -> list[int]:
    """Which of ``k`` entry points (gateways, routers) each request goes to, at random."""
    if k < 1:
        raise ValueError("need at least one entry point")
    if k == 1:
        return [0] * n
    entries: list[int] = np.random.default_rng(seed + 17).integers(0, k, size=n).tolist()
    return entries
