"""What gateways and workers agree on about the queue between them, whatever carries it.

Gateways ``put`` annotated jobs and await the returned future; workers
``pull`` up to a token budget when they have capacity and ``complete`` each
job with its result or error. Nothing pushes work at a worker. A queue that
spans machines is split in two: the gateway holds a ``JobSubmitter``, the
worker a ``JobPuller``; the in-process queue of one machine is both.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Collection, Iterable
from typing import Protocol

from embedder.errors import FlotillaError
from embedder.jobs import EmbedJob, JobResult

Outcome = JobResult | FlotillaError


class JobSubmitter(Protocol):
    """The gateway's half: hand a job in, await its outcome."""

    async def put(self, job: EmbedJob) -> asyncio.Future[JobResult]:
        """Enqueue a job; the future resolves with its result or raises its error.
        Cancelling the future withdraws the job."""
        ...

    def depth(self) -> Counter[str]:
        """Jobs waiting for an outcome, per model (waiting to be pulled, where the queue
        can tell them apart from running ones)."""
        ...


class JobPuller(Protocol):
    """The worker's half: take jobs when there is room, deliver each outcome."""

    async def pull(
        self, models: Collection[str], max_tokens: int, timeout_s: float
    ) -> list[EmbedJob]:
        """Take the most urgent jobs for ``models`` up to ``max_tokens`` (at least one
        when any is waiting); wait up to ``timeout_s`` for the first."""
        ...

    async def complete(self, job_id: str, outcome: Outcome) -> None:
        """Deliver a job's result or error to whoever waits for it."""
        ...

    def cancelled(self, job_ids: Iterable[str]) -> set[str]:
        """The ids among ``job_ids`` nobody needs any more (the requester gave up, or,
        for a distributed queue, the job was handed to another worker)."""
        ...


class WorkQueue(JobSubmitter, JobPuller, Protocol):
    """Both halves in one object: the in-process queue of a single machine."""


def resolve(future: asyncio.Future[JobResult], outcome: Outcome) -> None:
    """Hand an outcome to the future a requester awaits: the result, or the error raised
    there. The caller has made sure the future is not done yet."""
    if isinstance(outcome, FlotillaError):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
