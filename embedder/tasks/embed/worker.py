"""The worker: pulls what its device can finish in time, forms its own batches, runs them.

One worker per device, serving every model packed on that device. Two tasks:
the *former* pulls from the shared queue and forms the next batch when the
*runner* (``embedder.tasks.embed.pipeline``) asks for it, shortly before the device frees, so one
batch is in flight and the next is formed from everything queued by then. The runner
decodes, tokenizes and encodes on a host thread and runs forward passes on a device
thread, one batch's host work beside another's forward: the event loop never blocks
and the device is never shared between two batches.

What it takes is what this device can finish in time, measured, not configured: the
runner's ``Pace`` learns each model's cost per pass and per token here, and a model
with a latency target takes per batch (and per pull) what one batch can run in half of
it, though never batches so small that the fixed cost per pass dominates
(``batching.take_budget``, scaled by its controller, ``adaptive``). After a pull,
a job on its first delivery that would finish here only after its deadline, behind
what the device already holds, is handed back to the queue at once, and so is a
held job that would now only start too late (``batching.late_jobs``): a faster worker
pulls it next. A job on a later delivery is kept and run as best this device can.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from embedder.core.errors import DeadlineExceeded
from embedder.core.jobs import Job
from embedder.core.lifecycle import Lifecycle, cancel_and_wait, running, watch
from embedder.queue import JobPuller
from embedder.serving import metrics
from embedder.serving.pulling import IDLE_POLL_S, pull_or_pause
from embedder.serving.turns import DeviceTurns
from embedder.tasks.embed.adaptive import WaitController, flushed_full
from embedder.tasks.embed.batching import (
    BatchLimits,
    BatchPlan,
    DropReason,
    flush_delay,
    form_batch,
    late_jobs,
    take_budget,
)
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.execute import LoadedModel
from embedder.tasks.embed.pipeline import Handoff, Pipeline

log = logging.getLogger(__name__)


class Worker(Lifecycle):
    def __init__(
        self,
        queue: JobPuller,
        models: Mapping[str, LoadedModel],
        request_limits: RequestLimits,
        *,
        clock: Callable[[], float] = time.time,
        turns: DeviceTurns | None = None,
    ) -> None:
        self.queue = queue
        self.models = dict(models)
        self.request_limits = request_limits
        self.clock = clock
        self._ready = Handoff()
        self._pipeline = Pipeline(
            queue,
            self.models,
            request_limits,
            clock,
            self._delivered,
            turns=turns,
            put_back=self._put_back,
        )
        # Each model's limits as batches are formed: the profile's, with the wait and the
        # token budget steered where the model has a latency target.
        self.limits: dict[str, BatchLimits] = {}
        # Models with a latency target: their wait and budget come from these.
        self._steering: dict[str, WaitController] = {}
        # What one pull may bring: the biggest batch budget. More would sit here while the
        # batch runs, where on a shared queue a free worker could have run it.
        self.capacity_tokens = 0
        for name, m in self.models.items():
            self._set_limits(name, m.limits)
        self._tasks: list[asyncio.Task[None]] = []
        self._serving = asyncio.Event()  # set while the worker serves a model
        if self.models:
            self._serving.set()
        self._pending: list[Job] = []
        # Batches out of _pending but not delivered: stop() must fail these too.
        self._forming: tuple[Job, ...] = ()  # formed, not yet handed to the runner
        self._handing_back: list[Job] = []  # out of _pending, on their way to the queue

    async def start(self) -> None:
        if self._tasks:
            return
        self._tasks = [
            watch(asyncio.create_task(self._form_loop(), name="worker-former")),
            watch(asyncio.create_task(self._pipeline.run(self._ready), name="worker-runner")),
        ]

    async def stop(self) -> None:
        """Stop pulling; fail whatever was pulled but not run, so nothing hangs."""
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(*tasks)
        leftovers = [
            *self._pipeline.held(),
            *self._forming,
            *self._pending,
            *self._handing_back,
            *self._ready.drain(),
        ]
        self._pending, self._forming, self._handing_back = [], (), []
        self._pipeline.shutdown()
        for job in leftovers:  # completing a job already delivered is a no-op
            await self.queue.complete(
                job.id, DeadlineExceeded("the worker stopped before this job finished")
            )

    def running(self) -> bool:
        return running(*self._tasks)

    def _put_back(self, jobs: Sequence[Job]) -> None:
        """Jobs the runner held for an adapter's build: batched again from here."""
        self._pending.extend(jobs)

    def add_model(self, model: LoadedModel) -> None:
        """Serve one more model; the next pull asks for its jobs too."""
        name = model.spec.name
        self.models[name] = model
        self._set_limits(name, model.limits)
        self._serving.set()

    def replace_model(self, model: LoadedModel) -> LoadedModel:
        """Serve ``model`` (already loaded under the same name, on another runtime) from
        the next batch on, and return the one it replaces. Batches already prepared with
        the old one run on it to the end (``holds``), so nothing fails and nothing waits:
        the switch happens between batches."""
        name = model.spec.name
        old = self.models[name]
        self.models[name] = model  # the pipeline reads this dict as it prepares each batch
        self._pipeline.pace.forget(name)  # the new runtime's cost is its own
        self._set_limits(name, model.limits)
        return old

    def remove_model(self, name: str) -> LoadedModel:
        """Stop serving ``name``: the next pull leaves its jobs in the queue, and any a pull
        in flight catches go back (``_hand_back_unserved``). Returns the model; its batches
        already prepared run to the end (``holds``)."""
        model = self.models.pop(name)
        self.limits.pop(name, None)
        self._steering.pop(name, None)
        self.capacity_tokens = max((lim.max_tokens for lim in self.limits.values()), default=0)
        if not self.models:
            self._serving.clear()
        return model

    def in_hand(self, name: str) -> int:
        """Jobs of ``name`` this worker has pulled and not yet delivered."""
        held = [
            *self._pipeline.held(),
            *self._forming,
            *self._pending,
            *self._handing_back,
            *self._ready.peek(),
        ]
        return sum(1 for job in held if job.model == name)

    def holds(self, model: LoadedModel) -> bool:
        """Whether a batch prepared with ``model`` has yet to be delivered."""
        return self._pipeline.holds(model)

    # -- adaptive wait and budget -------------------------------------------

    def _set_limits(self, name: str, limits: BatchLimits) -> None:
        if limits.latency_target_s is not None:
            self._steering[name] = WaitController(limits.latency_target_s, limits.max_wait_s)
        self.limits[name] = limits
        self._steer(name)

    def _steer(self, name: str) -> None:
        """The model's limits take its controller's current wait (if it has one) and the
        budget its device can run in time at the measured pace (``take_budget``)."""
        profile = self.models[name].limits
        controller = self._steering.get(name)
        wait, factor = profile.max_wait_s, 1.0
        if controller is not None:
            wait, factor = controller.wait_s, controller.budget_factor
        budget = take_budget(self._pipeline.pace.cost(name), profile, factor)
        self.limits[name] = replace(self.limits[name], max_wait_s=wait, max_tokens=budget)
        self.capacity_tokens = max(limits.max_tokens for limits in self.limits.values())
        metrics.BATCH_WAIT_SECONDS.labels(name).set(wait)
        metrics.BATCH_BUDGET_TOKENS.labels(name).set(budget)

    def _delivered(self, name: str, jobs: Sequence[Job]) -> None:
        """Each delivered job's latency as the worker sees it (enqueued to delivered)."""
        if (controller := self._steering.get(name)) is not None:
            now = self.clock()
            controller.delivered((now - job.enqueued_at for job in jobs), now)
            self._steer(name)

    def _note_formed(self, plan: BatchPlan) -> None:
        controller = self._steering.get(plan.batch[0].model)
        if controller is not None:
            controller.formed(len(plan.batch), flushed_full(plan, self.limits))

    # -- forming ----------------------------------------------------------

    async def _form_loop(self) -> None:
        while True:
            await self._ready.wanted()  # pull and form only for a runner about to take it
            if not self.models:  # every model evicted: nothing to pull or form
                await self._serving.wait()
            if any(job.model not in self.models for job in self._pending):
                # Its model was removed while they waited (an eviction, the admin API):
                # back to the queue, before anything below reads the model's limits.
                await self._hand_back_unserved()
            now = self.clock()
            # Nothing pending, formed or running: a lull, in which controllers relax. A long
            # batch in flight is not one (its latencies are still to come).
            if self._steering and not (
                self._pending or self._forming or self._pipeline.held() or self._ready.waiting()
            ):
                for name, controller in self._steering.items():
                    controller.idle(now)
                    self._steer(name)
            delay = flush_delay(self._pending, self.limits, now)
            room = self.capacity_tokens - sum(job.est_tokens for job in self._pending)
            if delay > 0 and room > 0:
                pulled = await pull_or_pause(
                    self.queue, list(self.models), room, min(delay, IDLE_POLL_S)
                )
                self._pending.extend(pulled)
                await self._hand_back_unserved()  # a model removed while the pull waited
                if pulled:  # what this device would finish too late, a faster one may not
                    await self._hand_back_late(pulled, self.clock(), by_start=False)
                continue
            # Held while others ran: what would now only start too late goes back too.
            await self._hand_back_late(self._pending, now, by_start=True)
            await self._hand_back_unserved()  # a model removed while that waited
            plan = form_batch(
                self._pending,
                self.limits,
                now,
                self.queue.cancelled(job.id for job in self._pending),
            )
            self._pending = list(plan.remaining)
            self._forming = plan.batch
            for job, reason in plan.dropped:
                metrics.JOBS.labels(job.model, reason.value).inc()
                if reason is DropReason.EXPIRED:
                    await self.queue.complete(
                        job.id, DeadlineExceeded("the request's deadline passed while it waited")
                    )
            if plan.batch:
                self._note_formed(plan)
                await self._ready.give(plan.batch)
            self._forming = ()

    async def _hand_back_unserved(self) -> None:
        """Jobs of a model removed while a pull was in flight go back to the queue, where
        its next load (or another worker) finds them."""
        unserved = [job for job in self._pending if job.model not in self.models]
        if not unserved:
            return
        self._pending = [job for job in self._pending if job.model in self.models]
        self._handing_back = unserved
        try:
            await self.queue.hand_back(unserved)
        finally:
            self._handing_back = []

    async def _hand_back_late(self, among: Sequence[Job], now: float, *, by_start: bool) -> None:
        """Hand back those of ``among`` (on their first delivery, not yet expired) that
        this device would finish, or ``by_start`` start, only after their deadline at its
        pace, behind everything it holds (``late_jobs``); a faster worker pulls them next.
        Nothing near its deadline: one pass over the pending jobs, no await."""
        pace = self._pipeline.pace
        costs = {name: cost for name in self.models if (cost := pace.cost(name)) is not None}
        free_at = self._pipeline.free_at(now)
        late = late_jobs(self._pending, costs, self.limits, free_at, by_start=by_start)
        if not late:
            return
        candidates = {job.id for job in among}
        late = [job for job in late if job.id in candidates and job.deadline > now]
        if not late:
            return
        leaving = {job.id for job in late}
        self._pending = [job for job in self._pending if job.id not in leaving]
        self._handing_back = late
        try:
            await self.queue.hand_back(late)
        except Exception:  # a queue's hiccup: run them late rather than lose them
            log.exception("handing back %d late jobs failed; keeping them", len(late))
            self._pending.extend(late)
        else:
            for job in late:
                metrics.JOBS.labels(job.model, DropReason.HANDED_BACK.value).inc()
        self._handing_back = []  # not on cancellation: stop() then fails them
        # Let a worker already waiting on this queue pull them first: this one's next
        # pull would otherwise take them straight back (on a later delivery, to keep).
        await asyncio.sleep(0)
