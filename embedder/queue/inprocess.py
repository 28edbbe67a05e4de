"""The queue of one machine: gateway and workers are tasks of one event loop.

Per model, a heap ordered by urgency (earliest deadline first); a job's future
is its entry in the waiters, so withdrawing a job is cancelling its future and
the heaps drop it lazily when it reaches their head. A job a worker hands back goes
onto its heap again, where it keeps its place: its deadline has not moved.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import heapq
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Sequence

from embedder.core.jobs import Job, JobResult
from embedder.queue.protocol import Outcome, Partial, ReplyStream, resolve
from embedder.tasks.embed.batching import take_within, urgency


class InProcessQueue:
    """Per-model priority queues (earliest deadline first) shared by the tasks of one
    event loop."""

    def __init__(self) -> None:
        self._heaps: dict[str, list[tuple[tuple[float, int, float, str], Job]]] = {}
        self._waiters: dict[str, asyncio.Future[JobResult]] = {}
        self._streams: dict[str, ReplyStream] = {}
        # Parts of jobs whose requester takes the answer whole (a relay, say): joined
        # in front of the outcome's body, so nothing of a streamed answer is lost.
        self._parts: dict[str, list[bytes]] = {}
        self._available = asyncio.Condition()

    async def put(self, job: Job) -> asyncio.Future[JobResult]:
        if job.id in self._waiters:
            raise ValueError(f"job id {job.id!r} is already queued")
        future: asyncio.Future[JobResult] = asyncio.get_running_loop().create_future()
        self._waiters[job.id] = future
        future.add_done_callback(functools.partial(self._forget, job.id))
        async with self._available:
            heapq.heappush(self._heaps.setdefault(job.model, []), (urgency(job), job))
            self._available.notify_all()
        return future

    async def put_streaming(self, job: Job) -> ReplyStream:
        stream = ReplyStream(await self.put(job))
        self._streams[job.id] = stream
        return stream

    async def partial(self, job_id: str, partial: Partial) -> bool:
        if job_id not in self._waiters:
            return False
        stream = self._streams.get(job_id)
        if stream is not None:
            stream.push(partial)
        else:
            self._parts.setdefault(job_id, []).append(partial.body)
        return True

    def _forget(self, job_id: str, future: asyncio.Future[JobResult]) -> None:
        """Drop a finished future's entry, but never a newer job's under the same id."""
        if self._waiters.get(job_id) is future:
            del self._waiters[job_id]
            self._parts.pop(job_id, None)
        stream = self._streams.get(job_id)
        if stream is not None and stream.future is future:
            del self._streams[job_id]

    async def pull(self, models: Collection[str], max_tokens: int, timeout_s: float) -> list[Job]:
        async with self._available:
            if self._most_urgent(models) is None:
                try:
                    async with asyncio.timeout(timeout_s):
                        await self._available.wait_for(
                            lambda: self._most_urgent(models) is not None
                        )
                except TimeoutError:
                    return []
            return take_within(self._heads(models), max_tokens)

    async def hand_back(self, jobs: Sequence[Job]) -> None:
        """Back onto their heaps at their own urgency, one delivery more, for whichever
        puller comes next; a job withdrawn meanwhile is dropped (nobody waits for it)."""
        async with self._available:
            for job in jobs:
                if job.id not in self._waiters:
                    continue
                again = dataclasses.replace(job, deliveries=job.deliveries + 1)
                heapq.heappush(self._heaps.setdefault(job.model, []), (urgency(again), again))
            self._available.notify_all()

    def _heads(self, models: Collection[str]) -> Iterator[Job]:
        """Live jobs most urgent first; each is popped only when the next one is asked
        for, that is once the caller has taken it."""
        while (heap := self._most_urgent(models)) is not None:
            yield heap[0][1]
            heapq.heappop(heap)

    def _most_urgent(
        self, models: Collection[str]
    ) -> list[tuple[tuple[float, int, float, str], Job]] | None:
        """The heap whose live head is most urgent; withdrawn jobs at heads are discarded."""
        best = None
        for model in models:
            heap = self._heaps.get(model)
            while heap and heap[0][1].id not in self._waiters:
                heapq.heappop(heap)
            if heap and (best is None or heap[0][0] < best[0][0]):
                best = heap
        return best

    async def complete(self, job_id: str, outcome: Outcome) -> None:
        future = self._waiters.pop(job_id, None)
        parts = self._parts.pop(job_id, [])
        if future is None or future.done():
            return  # the requester gave up; nothing waits for this result
        if parts and isinstance(outcome, JobResult):
            outcome = dataclasses.replace(outcome, body=b"".join([*parts, outcome.body]))
        resolve(future, outcome)

    def cancelled(self, job_ids: Iterable[str]) -> set[str]:
        return {job_id for job_id in job_ids if job_id not in self._waiters}

    def depth(self) -> Counter[str]:
        return Counter(
            {
                model: sum(1 for _, job in heap if job.id in self._waiters)
                for model, heap in self._heaps.items()
            }
        )
