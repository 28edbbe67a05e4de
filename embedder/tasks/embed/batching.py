"""Batching, in one place: pure functions of the jobs, the limits and the time.

No I/O, no hidden clock and no torch, so they can be tested exhaustively:

- ``take_within``: jobs in a given order up to a token budget; every queue's
  ``pull`` and ``form_batch`` fill by it.
- ``flush_delay`` and ``form_batch``: when the worker forms a batch, and which.
- ``micro_batches``: how a runtime splits one batch into forward passes.

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


def flush_delay(
    pending: Sequence[Job], limits: Mapping[str, BatchLimits], now: float
) -> float:
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
