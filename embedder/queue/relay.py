"""Jobs of another queue (the shared one, across machines) fed into this process's own
in-process queue, so a worker that also embeds local work (Kafka ingest) batches both
by one rule: the in-process queue's earliest deadline first. Online requests carry
short deadlines and ingest jobs long ones, so online requests go first and ingest
fills the rest of each batch; a waiting ingest job's deadline never moves, so its
turn comes under steady online load too. No second priority rule: the worker pulls
from one queue, whatever fed it.

The relay holds at most ``budget()`` estimated tokens of the shared queue's jobs that
are not yet answered (about one batch): the rest stays in the shared queue for other
workers to take. Each outcome goes back to the shared queue (its reply, its ack);
a job that queue no longer answers for (handed back at a drain) is withdrawn here, so
the worker never runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Collection

from embedder.core.errors import FlotillaError
from embedder.core.jobs import Job, JobResult
from embedder.core.lifecycle import Lifecycle, watch
from embedder.queue.protocol import JobPuller, Outcome, WorkQueue

log = logging.getLogger(__name__)

POLL_S = 0.25  # how long one pull from the shared queue waits; bounds how long stop takes


class Relay(Lifecycle):
    def __init__(
        self,
        source: JobPuller,
        into: WorkQueue,
        models: Callable[[], Collection[str]],
        budget: Callable[[], int],
    ) -> None:
        self.source = source
        self.into = into
        self.models = models
        self.budget = budget
        self._relayed: dict[str, tuple[Job, asyncio.Future[JobResult]]] = {}
        self._room = asyncio.Event()
        self._replies: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def held_tokens(self) -> int:
        return sum(job.est_tokens for job, _ in self._relayed.values())

    async def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = watch(asyncio.create_task(self._run(), name="relay"))

    async def stop(self) -> None:
        """Stop pulling. Not cancelled mid-pull: a pull cut short could leave jobs taken
        from the shared queue that nobody runs. Jobs already relayed stay in the queue
        and are answered as the worker runs them (the shared queue's drain waits)."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self._room.set()
        await task
        self._withdraw_unanswered()

    async def close(self) -> None:
        """After the shared queue's drain and the worker's stop: what that queue gave up
        on is withdrawn, and the replies still being sent go out."""
        await self.stop()
        self._withdraw_unanswered()
        await asyncio.sleep(0)  # the done callbacks of the last outcomes run, sending them
        if self._replies:
            await asyncio.gather(*self._replies, return_exceptions=True)

    async def _run(self) -> None:
        while not self._stopping:
            room = self.budget() - self.held_tokens()
            models = list(self.models())
            if room <= 0 or not models:
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_S):
                        await self._room.wait()
                continue
            try:
                jobs = await self.source.pull(models, room, POLL_S)
            except Exception:  # the shared queue's trouble must not end online serving
                log.exception("pulling from the shared queue failed; trying again")
                await asyncio.sleep(POLL_S)
                continue
            for job in jobs:
                await self._relay(job)
            self._withdraw_unanswered()

    async def _relay(self, job: Job) -> None:
        try:
            future = await self.into.put(job)
        except ValueError:
            # Still queued here from an earlier delivery (handed back, then delivered to
            # this worker again): that entry stands for it, and its outcome is this one's.
            log.debug("job %s delivered again while queued here", job.id)
            return
        self._relayed[job.id] = (job, future)
        future.add_done_callback(functools.partial(self._answered, job.id))

    def _answered(self, job_id: str, future: asyncio.Future[JobResult]) -> None:
        self._relayed.pop(job_id, None)
        self._room.set()
        if future.cancelled():
            return  # withdrawn: the shared queue has handed it back already
        exc = future.exception()
        outcome: Outcome
        if exc is None:
            outcome = future.result()
        elif isinstance(exc, FlotillaError):
            outcome = exc
        else:  # the in-process queue resolves with results and FlotillaErrors only
            log.error("job %s failed outside the error classes", job_id, exc_info=exc)
            return
        reply = asyncio.ensure_future(self.source.complete(job_id, outcome))
        self._replies.add(reply)
        reply.add_done_callback(self._replies.discard)

    def _withdraw_unanswered(self) -> None:
        """Withdraw the jobs the shared queue no longer answers for (cancelling a future
        of the in-process queue withdraws its job)."""
        for job_id in self.source.cancelled(list(self._relayed)):
            entry = self._relayed.get(job_id)
            if entry is not None:
                entry[1].cancel()
