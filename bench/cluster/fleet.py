"""The simulated fleet: how fast each worker's device is, which models it hosts, and
the token budget it forms its batches to.

A ``Fleet`` is what ``bench.cluster.engine`` needs per worker; ``make_fleet`` builds it
from plain lists (the same ones the real benchmark passes to its emulated workers:
``bench.cluster.emulation``'s slowdowns and hosting map, models as indices). The
helpers name the uneven fleets the study runs: device generations (``gens3``: a third
of the workers each at 1x, 2x and 4x) and models hosted a few per worker, more
replicas for the more popular ones (``popular_hosting``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.cluster.cost_model import CostModel

# Which workers size their batch by their own pace: none, pull's only (the ideal pull:
# in a shared queue a smaller batch leaves work to a faster device), or every worker
# (push's too: the rule lives in the worker, whoever fills its queue).
PACES = ("off", "pull", "all")
# Share of the latency target a paced batch may take: the rest is left for the wait in
# the queue and for the max_wait window.
PACE_SHARE = 0.5
# Named slowdown profiles: the factors, each given to an equal share of the workers.
PROFILES: dict[str, tuple[float, ...]] = {"gens3": (1.0, 2.0, 4.0)}
Hosting = Mapping[int, Sequence[int]] | Sequence[Sequence[int]]


@dataclass(frozen=True)
class Fleet:
    slowdowns: tuple[float, ...]  # a worker's batch costs this times the cost model's
    hosted: tuple[tuple[int, ...], ...]  # per worker, the models it hosts, ascending
    budgets: tuple[int, ...]  # per worker, the tokens its batch holds at most
    pace: str  # which workers' budgets follow their pace (PACES)

    @property
    def workers(self) -> int:
        return len(self.slowdowns)

    @property
    def speed(self) -> float:
        """The fleet's capacity in workers of speed 1."""
        return sum(1.0 / s for s in self.slowdowns)

    def hosts(self, n_models: int) -> list[list[int]]:
        """Per model, the workers that host it."""
        out: list[list[int]] = [[] for _ in range(n_models)]
        for w, models in enumerate(self.hosted):
            for m in models:
                out[m].append(w)
        return out

    def hosts_all(self, n_models: int) -> bool:
        return all(len(models) == n_models for models in self.hosted)


def paced_budget(cost: CostModel, slowdown: float, target_s: float, share: float) -> int:
    """The most tokens ``t`` with ``slowdown * (fixed + per_token * t) <= share * target``,
    within [1, max_batch_tokens]: a batch this device finishes in its share of the target.
    At 1 the batch is one request (a request over the budget runs alone)."""
    room = share * target_s / slowdown - cost.fixed_s
    tokens = math.floor(room / cost.per_token_s) if room > 0 else 1
    return max(1, min(cost.max_batch_tokens, tokens))


def make_fleet(
    workers: int,
    n_models: int,
    cost: CostModel,
    policy: str,
    *,
    slowdowns: Sequence[float] | None = None,
    hosting: Hosting | None = None,
    pace: str | None = None,
    pace_share: float = PACE_SHARE,
    target_s: float | None = None,
) -> Fleet:
    """The fleet of ``workers``: by default every device at 1 and every model everywhere.
    ``pace`` None: ``pull`` when the slowdowns differ and ``target_s`` is known, else off."""
    slow = tuple(float(s) for s in slowdowns) if slowdowns is not None else (1.0,) * workers
    if len(slow) != workers or min(slow) <= 0:
        raise ValueError(f"need {workers} positive slowdowns, got {list(slow)}")
    hosted = _hosted(workers, n_models, hosting)
    if pace is None:
        pace = "pull" if len(set(slow)) > 1 and target_s is not None else "off"
    if pace not in PACES:
        raise ValueError(f"unknown pace {pace!r}; known: {', '.join(PACES)}")
    paced = pace == "all" or (pace == "pull" and policy == "pull")
    if paced and target_s is None:
        raise ValueError("a paced budget needs a latency target (p99_target_s)")
    budgets = tuple(
        paced_budget(cost, s, target_s, pace_share)
        if paced and target_s is not None
        else cost.max_batch_tokens
        for s in slow
    )
    return Fleet(slow, hosted, budgets, pace)


def _hosted(workers: int, n_models: int, hosting: Hosting | None) -> tuple[tuple[int, ...], ...]:
    if hosting is None:
        return (tuple(range(n_models)),) * workers
    rows = hosting.items() if isinstance(hosting, Mapping) else enumerate(hosting)
    by_worker = {int(w): tuple(sorted({int(m) for m in models})) for w, models in rows}
    hosted = tuple(by_worker.get(w, ()) for w in range(workers))
    if set(by_worker) - set(range(workers)):
        raise ValueError(f"hosting names workers outside 0..{workers - 1}")
    named = {m for models in hosted for m in models}
    if named != set(range(n_models)):
        raise ValueError(
            f"every model 0..{n_models - 1} needs a host, and no other: hosted {sorted(named)}"
        )
    return hosted


def hosting_indices(hosting: Mapping[int, Sequence[str]], names: Sequence[str]) -> list[list[int]]:
    """A hosting map by model name (``emulation.hosting_map``'s) as the simulation takes
    it: per worker, the indices in ``names`` (the workload's model k is ``names[k]``)."""
    index = {name: k for k, name in enumerate(names)}
    return [[index[name] for name in hosting.get(w, ())] for w in range(max(hosting) + 1)]


def profile_slowdowns(workers: int, spec: str) -> list[float]:
    """Each worker's slowdown from a profile name (``PROFILES``) or factors ``1,2,4``: each
    factor to an equal share of the workers, in order (the remainder to the first)."""
    factors = PROFILES.get(spec) or tuple(float(x) for x in spec.split(","))
    if not factors or min(factors) <= 0:
        raise ValueError(f"slowdowns {spec!r}: a profile ({', '.join(PROFILES)}) or factors")
    counts = [workers // len(factors)] * len(factors)
    for k in range(workers - sum(counts)):
        counts[k] += 1
    return [f for f, c in zip(factors, counts, strict=True) for _ in range(c)]


def per_worker_counts(workers: int, spec: str) -> list[int]:
    """Models per worker from ``3`` (each) or ``2-4`` (2, 3, 4, 2, ... in turn)."""
    low, _, high = spec.partition("-")
    a, b = int(low), int(high or low)
    if not 1 <= a <= b:
        raise ValueError(f"models per worker {spec!r}: N or LOW-HIGH with 1 <= LOW <= HIGH")
    return [a + w % (b - a + 1) for w in range(workers)]


def popular_hosting(
    shares: Sequence[float], counts: Sequence[int], speeds: Sequence[float] | None = None
) -> list[list[int]]:
    """Which models each worker hosts, worker w holding ``counts[w]`` distinct models, so
    that each model's hosts can give it capacity in proportion to its share of the
    requests: a worker of speed ``speeds[w]`` (1 / slowdown; default 1) is counted as
    ``speed / count`` per model it hosts, and its slots, the largest first, each go to the
    model still furthest below its due. The last slots go to models with no host yet, so
    that every model has one."""
    n, workers = len(shares), len(counts)
    speeds = list(speeds) if speeds is not None else [1.0] * workers
    if n > sum(counts) or max(counts) > n or len(speeds) != workers:
        raise ValueError(f"{n} models need at least {n} slots, at most {n} per worker, and "
                         "a speed per worker")  # fmt: skip
    due = [x / sum(shares) * sum(speeds) for x in shares]
    got = [0.0] * n
    hosted: list[list[int]] = [[] for _ in counts]
    # The largest slots first; a worker's first slot before anyone's second among equals.
    slots = sorted((-speeds[w] / counts[w], k, w) for w in range(workers) for k in range(counts[w]))
    for used, (minus_size, _, w) in enumerate(slots):
        unhosted = [m for m in range(n) if not got[m]]
        must = len(unhosted) >= len(slots) - used  # no slot to spare: a model with no host
        candidates = [m for m in (unhosted if must else range(n)) if m not in hosted[w]]
        if not candidates:
            raise ValueError("the hosting does not fit: fewer models per worker, or more")
        m = max(candidates, key=lambda k: (due[k] - got[k], -k))
        hosted[w].append(m)
        got[m] -= minus_size  # the slot's size, negated to sort the largest first
    return [sorted(h) for h in hosted]


def zipf_shares(n: int, exponent: float = 1.0) -> list[float]:
    """Popularity of ``n`` models, the k-th in proportion to 1 / k^exponent."""
    weights = [1.0 / (k + 1) ** exponent for k in range(n)]
    total = sum(weights)
    return [x / total for x in weights]
