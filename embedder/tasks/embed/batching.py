"""Batching, in one place: pure functions of the jobs, the limits and the time.

No I/O, no hidden clock and no torch, so they can be tested exhaustively:

- ``take_within``: jobs in a given order up to a token budget; every queue's
  ``pull`` and ``form_batch`` fill by it.
- ``flush_delay`` and ``form_batch``: when the worker forms a batch, and which.
- ``micro_batches``: how a runtime splits one batch into forward passes.
- ``take_budget`` and ``late_jobs``: how much a worker takes at its device's measured
  pace (``BatchCost``), and which jobs it cannot finish in time and hands back.

Fairness: groups (model, adapter, task) compete by their most urgent job,
earliest deadline first; a model whose limits mix adapters groups by (model,
task) and each row runs its own adapter. A waiting job's deadline never moves, so every
group's turn comes: no starvation.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from embedder.core.jobs import Job


@dataclass(frozen=True, slots=True)
class BatchLimits:
    max_tokens: int
    max_requests: int
    max_wait_s: float
    mix_adapters: bool = False
    # None: always wait max_wait_s; else the worker steers the wait in [0, max_wait_s]
    # toward this p50 latency (embedder.tasks.embed.adaptive).
    latency_target_s: float | None = None


GroupKey = tuple[str, str | None, object]


def group_key(job: Job, limits: Mapping[str, BatchLimits]) -> GroupKey:
    """Jobs with the same key can share a forward pass."""
    model, adapter, task = job.group
    return (model, None if limits[model].mix_adapters else adapter, task)


class DropReason(enum.StrEnum):
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    HANDED_BACK = "handed_back"  # returned to the queue for a faster worker (late_jobs)


@dataclass(frozen=True, slots=True)
class BatchPlan:
    batch: tuple[Job, ...]  # one group, shortest first
    remaining: tuple[Job, ...]  # live jobs left for later, in their original order
    dropped: tuple[tuple[Job, DropReason], ...]

    @property
    def tokens(self) -> int:
        return sum(job.est_tokens for job in self.batch)


def urgency(job: Job) -> tuple[float, int, float, str]:
    return (job.deadline, job.priority, job.enqueued_at, job.id)


def take_within(
    jobs: Iterable[Job],
    max_tokens: int,
    max_requests: int | None = None,
    *,
    skip_misfits: bool = False,
) -> list[Job]:
    """Jobs in the order given while their estimated tokens fit ``max_tokens``.

    The first job is always taken, so one larger than the whole budget runs alone rather
    than starving; ``max_requests`` (at least 1) caps the count. At a job that does not
    fit, taking stops, or with ``skip_misfits`` goes on to later, smaller ones. The
    iterator is advanced only to decide on the next job: a queue may hand out its heads
    lazily and pop each one once it is taken.
    """
    taken: list[Job] = []
    tokens = 0
    for job in jobs:
        if taken and tokens + job.est_tokens > max_tokens:
            if skip_misfits:
                continue
            break
        taken.append(job)
        tokens += job.est_tokens
        if len(taken) == max_requests:  # full: stop before reading another job
            break
    return taken


def _split_live(
    pending: Iterable[Job], now: float, cancelled: Set[str]
) -> tuple[list[Job], list[tuple[Job, DropReason]]]:
    live: list[Job] = []
    dropped: list[tuple[Job, DropReason]] = []
    for job in pending:
        if job.id in cancelled:
            dropped.append((job, DropReason.CANCELLED))
        elif job.deadline <= now:
            dropped.append((job, DropReason.EXPIRED))
        else:
            live.append(job)
    return live, dropped


def form_batch(
    pending: Sequence[Job],
    limits: Mapping[str, BatchLimits],
    now: float,
    cancelled: Set[str] = frozenset(),
) -> BatchPlan:
    """Pick the next batch: the most urgent group, filled in urgency order.

    A job larger than the whole budget still runs, alone, so that it cannot
    starve; jobs that do not fit are skipped in favour of later ones that do.
    ``limits`` is keyed by model name.
    """
    live, dropped = _split_live(pending, now, cancelled)
    if not live:
        return BatchPlan((), (), tuple(dropped))
    first = min(live, key=urgency)
    group = group_key(first, limits)
    limit = limits[first.model]
    chosen = take_within(
        sorted((j for j in live if group_key(j, limits) == group), key=urgency),
        limit.max_tokens,
        limit.max_requests,
        skip_misfits=True,
    )
    taken = {job.id for job in chosen}
    remaining = tuple(job for job in live if job.id not in taken)
    chosen.sort(key=lambda job: (job.est_tokens, job.id))
    return BatchPlan(tuple(chosen), remaining, tuple(dropped))


def flush_delay(pending: Sequence[Job], limits: Mapping[str, BatchLimits], now: float) -> float:
    """Seconds until a batch should be formed: 0 when some group is full or has waited
    its ``max_wait``; ``inf`` when nothing is pending."""
    tokens: dict[GroupKey, int] = {}
    counts: dict[GroupKey, int] = {}
    delay = math.inf
    for job in pending:
        limit = limits[job.model]
        key = group_key(job, limits)
        tokens[key] = tokens.get(key, 0) + job.est_tokens
        counts[key] = counts.get(key, 0) + 1
        if tokens[key] >= limit.max_tokens or counts[key] >= limit.max_requests:
            return 0.0
        # A job past its deadline must be dropped promptly, so it also triggers a flush.
        due = min(job.enqueued_at + limit.max_wait_s, job.deadline)
        delay = min(delay, max(0.0, due - now))
    return delay


def micro_batches(lengths: Sequence[int], max_tokens: int, max_sequences: int) -> list[list[int]]:
    """Indices grouped into forward passes, shortest first; each pass holds at most
    ``max_tokens`` padded tokens (a single longer input still gets its own pass)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    passes: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted ascending, so lengths[i] is the padded width if i joins this pass.
        if current and (
            (len(current) + 1) * lengths[i] > max_tokens or len(current) >= max_sequences
        ):
            passes.append(current)
            current = []
        current.append(i)
    if current:
        passes.append(current)
    return passes


# -- what a device can finish in time ----------------------------------------------------

# One batch may take this share of a model's latency target: a job taken now waits for
# the batch on the device (at most one budget's worth, since a worker holds nothing it is
# not about to run) and then runs in its own, so two batches must fit the target.
TARGET_SHARE = 0.5
MIN_BUDGET_TOKENS = 16  # about one small request: a budget never shrinks below this
# Nor below the batch whose fixed cost per pass is a tenth of its time: a smaller one
# loses more throughput than that, and does so exactly when batches are full, that is
# under load, where an overloaded device only falls further behind. A target that would
# need smaller batches cannot be met under load on this device anyway.
MIN_EFFICIENCY = 0.9


@dataclass(frozen=True, slots=True)
class BatchCost:
    """What a batch of one model costs on this device: ``fixed_s + per_token_s * tokens``
    seconds (both at least 0), as the worker measured it."""

    fixed_s: float
    per_token_s: float

    def seconds(self, tokens: int) -> float:
        return self.fixed_s + self.per_token_s * tokens

    def tokens_within(self, seconds: float) -> float:
        """The most tokens one batch may hold to take at most ``seconds``: ``inf`` when
        tokens cost nothing, negative when even the fixed cost does not fit."""
        if self.per_token_s <= 0:
            return math.inf if self.fixed_s <= seconds else -math.inf
        return (seconds - self.fixed_s) / self.per_token_s

    def efficient_tokens(self, efficiency: float) -> float:
        """The fewest tokens for which tokens take ``efficiency`` of a batch's time."""
        if self.per_token_s <= 0:
            return math.inf if self.fixed_s > 0 else 0.0
        return self.fixed_s / self.per_token_s * efficiency / (1.0 - efficiency)


def take_budget(cost: BatchCost | None, limits: BatchLimits, factor: float = 1.0) -> int:
    """Tokens this device takes for one batch of a model: what one batch can run within
    ``TARGET_SHARE`` of the latency target at the measured pace, times ``factor`` (the
    latency controller's, in (0, 1]), at least ``MIN_BUDGET_TOKENS`` and what runs at
    ``MIN_EFFICIENCY``, at most the profile's ``max_tokens``. Untimed, or without a
    target, it is ``max_tokens``. Where the cost per token dominates, a device 3x slower
    than another thus takes a third of what the other takes."""
    top = limits.max_tokens
    if cost is None or limits.latency_target_s is None:
        return top
    bound = min(top, cost.tokens_within(TARGET_SHARE * limits.latency_target_s))
    floor = max(MIN_BUDGET_TOKENS, cost.efficient_tokens(MIN_EFFICIENCY))
    # A millionth of a token forgives float rounding (0.023 / 0.0001 is 229.99999...).
    return int(min(top, max(floor, factor * bound)) + 1e-6)


def late_jobs(
    jobs: Sequence[Job],
    costs: Mapping[str, BatchCost],
    limits: Mapping[str, BatchLimits],
    free_at: float,
    *,
    by_start: bool = False,
) -> list[Job]:
    """The jobs on their first delivery this device would finish (``by_start``: start)
    only after their deadline, running ``jobs`` most urgent first, in batches within each
    model's limits, once it is free of what it already runs (at ``free_at``).

    A job's finish is ``free_at`` plus the device's time for every job at least as
    urgent: each model's among them in the fewest batches its ``max_tokens`` and
    ``max_requests`` allow, at its ``costs``; its start is that finish less its own
    batch (the last of its model, or an average one if larger). The fewest batches can
    only undercount passes (``form_batch`` runs a misfit in a pass of its own), so the
    estimate errs toward keeping a job. Jobs of a model with
    no cost (untimed) are never late and add nothing. A job on a later delivery is never
    late: it was handed back once already, so it is run as best this device can.
    Cheap when nothing is near: one pass bounds every finish by the finish of all, and
    only when that passes the earliest deadline are the jobs sorted.
    """
    first = [job for job in jobs if job.deliveries <= 1 and job.model in costs]
    if not first:
        return []
    totals: dict[str, tuple[int, int]] = {}  # per model: tokens, jobs
    for job in jobs:
        tokens, count = totals.get(job.model, (0, 0))
        totals[job.model] = (tokens + job.est_tokens, count + 1)
    all_s = sum(
        _run_s(costs[model], limits[model], tokens, count)
        for model, (tokens, count) in totals.items()
        if model in costs
    )
    if free_at + all_s <= min(job.deadline for job in first):
        return []
    return _late_in_order(jobs, costs, limits, free_at, by_start)


def _batches(limit: BatchLimits, tokens: int, count: int) -> int:
    """How many batches at the least hold ``count`` jobs of ``tokens`` in all."""
    by_tokens = math.ceil(tokens / max(1, limit.max_tokens))
    return max(by_tokens, math.ceil(count / max(1, limit.max_requests)))


def _run_s(cost: BatchCost, limit: BatchLimits, tokens: int, count: int) -> float:
    """Seconds to run ``count`` jobs of ``tokens`` in all, in whole batches."""
    return _batches(limit, tokens, count) * cost.fixed_s + cost.per_token_s * tokens


def _late_in_order(
    jobs: Sequence[Job],
    costs: Mapping[str, BatchCost],
    limits: Mapping[str, BatchLimits],
    free_at: float,
    by_start: bool,
) -> list[Job]:
    late: list[Job] = []
    through: dict[str, tuple[int, int]] = {}  # per model: tokens and jobs up to this one
    device_s = 0.0  # the device's time for all of them
    for job in sorted(jobs, key=urgency):
        cost = costs.get(job.model)
        if cost is None:
            continue
        limit = limits[job.model]
        tokens, count = through.get(job.model, (0, 0))
        device_s -= _run_s(cost, limit, tokens, count)
        tokens, count = through[job.model] = (tokens + job.est_tokens, count + 1)
        device_s += _run_s(cost, limit, tokens, count)
        when = free_at + device_s
        if by_start:  # less its own batch: the last, or an average one, whichever is larger
            batches = _batches(limit, tokens, count)
            own = max(tokens - (batches - 1) * limit.max_tokens, tokens / batches)
            when -= cost.fixed_s + cost.per_token_s * own
        if job.deliveries <= 1 and when > job.deadline:
            late.append(job)
    return late
