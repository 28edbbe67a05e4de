"""Pulling as every task's loop does it, and what happens to jobs nobody waits for.

A queue's hiccup (a broker reconnecting) must never end a loop: the pull is logged and
retried after a pause. A job whose client left is dropped unanswered (nobody reads the
answer); a job whose deadline passed is answered with ``DeadlineExceeded``; both are
counted per model and outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from embedder.core.errors import DeadlineExceeded, FlotillaError
from embedder.core.jobs import Job
from embedder.queue import JobPuller
from embedder.serving import metrics

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.25  # how long an idle loop waits for a job before rechecking (and stopping)


async def pull_or_pause(
    queue: JobPuller, models: Sequence[str], budget: int, timeout_s: float
) -> list[Job]:
    """One pull of up to ``budget`` estimated tokens; on a queue's failure, none after a
    pause of ``IDLE_POLL_S``, so the caller's loop simply goes round again."""
    try:
        return await queue.pull(list(models), budget, timeout_s)
    except Exception:
        log.exception("pulling jobs for %s failed; retrying", ", ".join(models))
        await asyncio.sleep(IDLE_POLL_S)
        return []


async def settle_departed(
    queue: JobPuller, model: str, jobs: Iterable[Job], now: float, *, while_: str = "it waited"
) -> list[Job]:
    """The jobs still worth running: those whose client left are dropped, those past their
    deadline answered with ``DeadlineExceeded`` (saying what they were doing, ``while_``)."""
    jobs = list(jobs)
    gone = queue.cancelled(job.id for job in jobs)
    live: list[Job] = []
    for job in jobs:
        if job.id in gone:
            metrics.JOBS.labels(model, "cancelled").inc()
        elif job.deadline <= now:
            metrics.JOBS.labels(model, "expired").inc()
            await queue.complete(
                job.id, DeadlineExceeded(f"the request's deadline passed while {while_}")
            )
        else:
            live.append(job)
    return live


async def fail_all(queue: JobPuller, jobs: Iterable[Job], error: FlotillaError) -> None:
    """Answer every job with ``error``: a stopped loop or a failed pass leaves no waiter."""
    for job in jobs:
        await queue.complete(job.id, error)
