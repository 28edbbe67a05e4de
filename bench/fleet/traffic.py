"""The load: which model each request names, and when it is sent. Pure (a seed in, a plan
out), so a run can be replayed and its shape tested.

Popularity follows a Zipf law over the entries (rank r is asked ∝ 1 / r^s), and the
ranking rotates by ``step`` places every ``shift_s``: the models that were hot fall to the
tail and others rise, so the resident set has to follow. Requests arrive open-loop, as a
Poisson process at ``rate_per_s`` whatever the answers take: a closed-loop client held by a
slow load would send less meanwhile, so the mix the server saw would depend on its own
latency and a load's wait would hide the requests that should have queued behind it."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Planned:
    at_s: float  # since the load began
    model: str
    phase: int  # which ranking was in force (0, 1, ...): a new one every shift_s
    inputs: tuple[int, ...]  # indices into the benchmark's texts


@dataclass(frozen=True, slots=True)
class Shape:
    """What the load looks like: rate, length, skew and how the ranking moves."""

    duration_s: float
    rate_per_s: float
    shift_s: float
    step: int  # places the ranking rotates by at each shift
    zipf_s: float  # the exponent: 0 uniform, higher more skewed
    inputs: tuple[int, int] = (1, 4)  # texts per request, inclusive


def zipf_weights(count: int, s: float) -> list[float]:
    """Rank r's share of the requests (r = 1 first), summing to 1."""
    raw = [1.0 / r**s for r in range(1, count + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def ranking(models: Sequence[str], phase: int, step: int) -> list[str]:
    """The models from most to least asked in ``phase``: the fleet's order rotated left by
    ``phase * step``, so each shift hands the top ranks to the models behind them."""
    if not models:
        return []
    k = (phase * step) % len(models)
    return [*models[k:], *models[:k]]


def popularity(models: Sequence[str], phase: int, shape: Shape) -> dict[str, float]:
    """Each model's expected share of the requests in ``phase``."""
    ranked = ranking(models, phase, shape.step)
    return dict(zip(ranked, zipf_weights(len(ranked), shape.zipf_s), strict=True))


def plan(models: Sequence[str], shape: Shape, n_texts: int, seed: int) -> list[Planned]:
    """The whole run's requests in send order: Poisson arrivals, each naming a model drawn
    from the popularity of its phase and 1..n of the texts."""
    if shape.rate_per_s <= 0 or shape.shift_s <= 0 or n_texts < 1:
        raise ValueError("the rate, the shift period and the texts must be positive")
    rng = random.Random(seed)
    weights = zipf_weights(len(models), shape.zipf_s)
    low, high = shape.inputs
    out: list[Planned] = []
    at = rng.expovariate(shape.rate_per_s)
    while at < shape.duration_s:
        phase = int(at // shape.shift_s)
        model = rng.choices(ranking(models, phase, shape.step), weights=weights)[0]
        inputs = tuple(rng.randrange(n_texts) for _ in range(rng.randint(low, high)))
        out.append(Planned(at, model, phase, inputs))
        at += rng.expovariate(shape.rate_per_s)
    return out
