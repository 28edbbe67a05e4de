"""What gateways and workers agree on about the queue between them, whatever carries it.

Gateways ``put`` annotated jobs and await the returned future; workers
``pull`` up to a token budget when they have capacity and ``complete`` each
job with its result or error. Nothing pushes work at a worker. A queue that
spans machines is split in two: the gateway holds a ``JobSubmitter``, the
worker a ``JobPuller``; the in-process queue of one machine is both.

**Streams.** A job may be answered in parts (generation streams its tokens): the
worker sends ``Partial`` chunks through ``StreamingPuller.partial`` and then the final
outcome through ``complete`` as for any job; a gateway that wants the parts puts the
job with ``StreamingSubmitter.put_streaming`` and reads a ``ReplyStream``: every
partial in order, then the outcome. ``partial`` answering False means nobody listens
any more (the client left): the worker stops that job at its next step. A partial's
``seq`` counts from 0 per job. The JetStream substrate carries parts as messages on
the gateway's reply inbox, like the outcome: each with the job id and its ``seq`` (the
outcome has none, which marks it final); the gateway puts them in ``seq`` order and
drops repeats (a redelivered job answered again), and parts and outcome of one worker
travel one connection, so the outcome comes after its parts. What it does not carry yet
is the gateway's withdrawal: a client that leaves a distributed stream stops its
sequence only when the deadline passes. A substrate without ``partial`` answers a
stream whole at its end.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from embedder.core.errors import FlotillaError
from embedder.core.jobs import Job, JobResult

Outcome = JobResult | FlotillaError


class JobSubmitter(Protocol):
    """The gateway's half: hand a job in, await its outcome."""

    async def put(self, job: Job) -> asyncio.Future[JobResult]:
        """Enqueue a job; the future resolves with its result or raises its error.
        Cancelling the future withdraws the job."""
        ...

    def depth(self) -> Counter[str]:
        """Jobs waiting for an outcome, per model (waiting to be pulled, where the queue
        can tell them apart from running ones)."""
        ...


class JobPuller(Protocol):
    """The worker's half: take jobs when there is room, deliver each outcome."""

    async def pull(self, models: Collection[str], max_tokens: int, timeout_s: float) -> list[Job]:
        """Take the most urgent jobs for ``models`` up to ``max_tokens`` (at least one
        when any is waiting); wait up to ``timeout_s`` for the first."""
        ...

    async def complete(self, job_id: str, outcome: Outcome) -> None:
        """Deliver a job's result or error to whoever waits for it."""
        ...

    async def hand_back(self, jobs: Sequence[Job]) -> None:
        """Return pulled, unstarted jobs to the queue at once, for whichever worker pulls
        next (a faster one): the worker cannot finish them in time. Each comes back with
        ``deliveries`` one higher; a job withdrawn meanwhile is simply dropped."""
        ...

    def cancelled(self, job_ids: Iterable[str]) -> set[str]:
        """The ids among ``job_ids`` nobody needs any more (the requester gave up, or,
        for a distributed queue, the job was handed to another worker)."""
        ...


class WorkQueue(JobSubmitter, JobPuller, Protocol):
    """Both halves in one object: the in-process queue of a single machine."""


@dataclass(frozen=True, slots=True)
class Partial:
    """One part of a streamed answer, ``seq`` counting from 0 per job."""

    seq: int
    body: bytes


class ReplyStream:
    """What a gateway reads of a streamed job: its partials in order, then its outcome.
    The stream is bounded by what the job makes (a generation job sends at most one
    partial a token, up to its max_tokens), so the buffer needs no bound of its own."""

    def __init__(self, future: asyncio.Future[JobResult]) -> None:
        self.future = future
        self._partials: asyncio.Queue[Partial] = asyncio.Queue()

    def push(self, partial: Partial) -> None:
        self._partials.put_nowait(partial)

    async def next(self) -> Partial | JobResult:
        """The next partial, else the outcome (an error raises) once no partial is left."""
        if not self._partials.empty():
            return self._partials.get_nowait()
        getter = asyncio.ensure_future(self._partials.get())
        try:
            waiting: set[asyncio.Future[Any]] = {getter, self.future}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        return self.future.result()

    def cancel(self) -> None:
        """Withdraw the job: the worker stops it at its next step."""
        self.future.cancel()


@runtime_checkable
class StreamingSubmitter(Protocol):
    async def put_streaming(self, job: Job) -> ReplyStream:
        """``put``, answered in parts."""
        ...


@runtime_checkable
class StreamingPuller(Protocol):
    async def partial(self, job_id: str, partial: Partial) -> bool:
        """Send a part of a job's answer; False when nobody waits for the job any more."""
        ...


def resolve(future: asyncio.Future[JobResult], outcome: Outcome) -> None:
    """Hand an outcome to the future a requester awaits: the result, or the error raised
    there. The caller has made sure the future is not done yet."""
    if isinstance(outcome, FlotillaError):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
