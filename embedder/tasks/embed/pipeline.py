"""The worker's runner: formed batches through three stages on two threads.

Decoding + tokenizing (``prepare_batch``) and shaping + encoding replies
(``finish_batch``) are host work and run on the host thread; adapters and the forward
pass (``forward_batch``) run on the device thread. While the device runs batch N, the
host thread encodes batch N-1's replies and prepares batch N+1, so the device waits for
the host only when the host is the slower of the two. Both threads release the GIL
where they spend their time (torch kernels, the tokenizer's Rust, a GPU's wait), so the
event loop keeps answering meanwhile. One host thread, not a pool: a tokenizer is not
safe to call from two threads at once.

Batch N+1 is *formed* and prepared as late as still lets it be ready when the device
frees (``Pace``, ``Handoff``): it then holds everything that arrived during batch N's
forward, not only what was queued when N started, and a job withdrawn or expired
meanwhile is never tokenized. Until both stages have been timed, the next batch is
asked for as soon as a forward starts and prepared only when its turn comes.

A job whose adapter the runtime is still building for (an exported graph with the adapter
merged: tens of seconds, in the background) is neither run nor failed: it is held until
the build ends and then batched again (``Pipeline._park``), within its deadline.

The same ``Pace`` is the device's measure for the worker: each model's cost per pass and
per token, fitted from its forward passes (``DeviceFit``), sets how much the worker takes
and when the device will be free of what it holds (``Pipeline.free_at``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from embedder.core import tracing
from embedder.core.errors import AdapterBuilding, FlotillaError, InferenceFailed
from embedder.core.jobs import Job
from embedder.core.lifecycle import cancel_and_wait
from embedder.queue import JobPuller
from embedder.serving import metrics
from embedder.serving.thread import OneThread
from embedder.serving.turns import DeviceTurns
from embedder.tasks.embed.batching import BatchCost
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.execute import (
    BatchReport,
    Forwarded,
    LoadedModel,
    Prepared,
    finish_batch,
    forward_batch,
    prepare_batch,
)

log = logging.getLogger(__name__)

Batch = tuple[Job, ...]
PARKED_RETRY_S = 1.0  # how often jobs held for an adapter with no build to watch look again


def estimated(jobs: Sequence[Job]) -> int:
    """The jobs' estimated tokens: the pace is measured in the currency the worker takes
    and budgets in (the gateway's estimates, ``Job.est_tokens``), so the fit absorbs
    whatever bias the estimate has against the tokenizer."""
    return sum(job.est_tokens for job in jobs)


class DeviceFit:
    """One model's cost on this device, learned from its batches: seconds in forward =
    ``fixed_s + per_token_s * tokens``, an exponentially weighted least-squares fit.

    Each batch's weight decays by ``MEMORY`` per newer batch (about the last 20 count),
    so the fit follows a device that slows down (another process, heat) or speeds up.
    The first batch, a warm-up, is left out. Two guards keep it sound before the data
    can tell the two costs apart:

    - Until the batches' sizes differ clearly (weighted spread under ``SPREAD`` of their
      mean size), the line through the origin: all the time is cost per token. Exact at
      the size seen and an overestimate for larger batches, so a budget from it never
      falls below a size seen to run within the bound, and larger batches, once they
      run, teach it the fixed cost.
    - Neither cost is ever negative (noise on nearly equal sizes can tilt a line that
      way): the fit is then the best one with that cost at 0 (non-negative least
      squares, the better of the two edges).
    """

    MEMORY = 0.95
    SPREAD = 0.1

    def __init__(self) -> None:
        # Weighted sums of 1, x, y, x*x, x*y, y*y (x tokens, y seconds).
        self._w = self._x = self._y = self._xx = self._xy = self._yy = 0.0
        self.cost: BatchCost | None = None
        # A model's first pass pays for its warm-up (allocations, kernel choice, caches),
        # often several passes' worth: it would skew the fit for a long while.
        self._warm = False

    def add(self, seconds: float, tokens: int) -> None:
        if tokens <= 0:
            return
        if not self._warm:
            self._warm = True
            return
        m, x, y = self.MEMORY, float(tokens), seconds
        self._w = m * self._w + 1.0
        self._x = m * self._x + x
        self._y = m * self._y + y
        self._xx = m * self._xx + x * x
        self._xy = m * self._xy + x * y
        self._yy = m * self._yy + y * y
        self.cost = self._fit()

    def _fit(self) -> BatchCost:
        through_origin = BatchCost(0.0, max(0.0, self._xy / self._xx))
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var_x = self._xx / self._w - mean_x * mean_x
        if var_x < (self.SPREAD * mean_x) ** 2:
            return through_origin
        per_token = (self._xy / self._w - mean_x * mean_y) / var_x
        fixed = mean_y - per_token * mean_x
        if per_token >= 0 and fixed >= 0:
            return BatchCost(fixed, per_token)
        flat = BatchCost(max(0.0, mean_y), 0.0)
        return min((through_origin, flat), key=self._squared_error)

    def _squared_error(self, cost: BatchCost) -> float:
        a, b = cost.fixed_s, cost.per_token_s
        return (
            self._yy
            - 2 * a * self._y
            - 2 * b * self._xy
            + a * a * self._w
            + 2 * a * b * self._x
            + b * b * self._xx
        )


class Pace:
    """This device's measured pace: each model's batch cost (``DeviceFit``) and the host's
    seconds per token of preparing, smoothed over batches. Says how long one batch takes
    (``batch_s``) and how long after a forward starts the next batch's preparation
    should begin (``lead_s``)."""

    SMOOTHING = 0.2  # weight of the newest batch in the preparing pace
    SAFETY = 2.0  # prepare this many times the expected preparing time ahead: hosts vary

    def __init__(self) -> None:
        self.fits: dict[str, DeviceFit] = {}
        self.prepare_s_per_token: float | None = None

    def timed_device(self, model: str, seconds: float, tokens: int) -> None:
        self.fits.setdefault(model, DeviceFit()).add(seconds, tokens)

    def forget(self, model: str) -> None:
        """Learn ``model``'s cost afresh: it runs on another runtime from now on."""
        self.fits.pop(model, None)

    def timed_prepare(self, seconds: float, tokens: int) -> None:
        if tokens <= 0:
            return
        new, old = seconds / tokens, self.prepare_s_per_token
        self.prepare_s_per_token = new if old is None else old + self.SMOOTHING * (new - old)

    def cost(self, model: str) -> BatchCost | None:
        """The model's batch cost here; None until its batches were timed (the first is a
        warm-up and does not count)."""
        fit = self.fits.get(model)
        return None if fit is None else fit.cost

    def batch_s(self, model: str, tokens: int) -> float | None:
        """Seconds one batch of ``tokens`` of ``model`` takes here; None while untimed."""
        cost = self.cost(model)
        return None if cost is None else cost.seconds(tokens)

    def lead_s(self, model: str, running_tokens: int, next_tokens: int) -> float | None:
        """Seconds after the start of a forward over ``running_tokens`` of ``model`` to
        start preparing a batch of about ``next_tokens``; None while either stage is
        untimed."""
        device_s = self.batch_s(model, running_tokens)
        if device_s is None or self.prepare_s_per_token is None:
            return None
        return max(0.0, device_s - self.SAFETY * self.prepare_s_per_token * next_tokens)


class Handoff:
    """Formed batches from the worker's former to the runner, one at a time and only
    when the runner asks: a batch formed early would miss the jobs that arrive while the
    device is still busy, and jobs a worker holds are jobs no other worker can take."""

    def __init__(self) -> None:
        self._wanted = asyncio.Event()
        self._batches: asyncio.Queue[Batch] = asyncio.Queue(maxsize=1)
        self._given: Batch = ()  # formed, not yet taken

    def ask(self) -> None:
        """The runner will take a batch soon: the former may form it now."""
        self._wanted.set()

    async def take(self) -> Batch:
        if self._batches.empty():
            self.ask()
        batch = await self._batches.get()
        self._given = ()
        return batch

    async def wanted(self) -> None:
        await self._wanted.wait()

    async def give(self, batch: Batch) -> None:
        self._wanted.clear()
        self._given = batch
        await self._batches.put(batch)

    def waiting(self) -> int:
        """Batches formed but not yet taken."""
        return self._batches.qsize()

    def peek(self) -> Batch:
        """The batch formed and not yet taken, if any."""
        return self._given

    def drain(self) -> list[Job]:
        self._given = ()
        jobs: list[Job] = []
        while not self._batches.empty():
            jobs.extend(self._batches.get_nowait())
        return jobs


@dataclass
class _Staged:
    """A batch on its way: the jobs, then what the host made of them, and with which
    model: the batch runs on that one to the end, even when the worker has since moved
    the model to another runtime (``Worker.replace_model``)."""

    jobs: Batch
    prepared: Prepared | None = None
    model: LoadedModel | None = None
    # Its spans from the moment the runner takes it (embedder.core.tracing); off: no-ops.
    trace: tracing.BatchSpans = field(init=False)

    def __post_init__(self) -> None:
        self.trace = tracing.batch(self.jobs)


class Pipeline:
    """Runs the batches a worker forms; ``held`` lists the jobs it has taken but not
    delivered, which a stopping worker fails."""

    def __init__(
        self,
        queue: JobPuller,
        models: Mapping[str, LoadedModel],
        request_limits: RequestLimits,
        clock: Callable[[], float],
        delivered: Callable[[str, Sequence[Job]], None] = lambda model, jobs: None,
        turns: DeviceTurns | None = None,
        put_back: Callable[[Sequence[Job]], None] | None = None,
    ) -> None:
        self.queue = queue
        # Where jobs held for an adapter's build go when it ends, to be batched again;
        # None: they get the build's retriable 503 at once.
        self.put_back = put_back
        self._parked: list[Job] = []
        self._parking: set[asyncio.Task[None]] = set()
        # Shared with the generation engines on the same device (embedder.serving.turns).
        self.turns = turns or DeviceTurns()
        self.delivered = delivered  # told of each batch's jobs before they are completed
        self.models = models  # the worker's own dict: models it adds are seen here
        self.request_limits = request_limits
        self.clock = clock
        self.pace = Pace()
        self._host = OneThread("host")
        self._device = OneThread("device")
        self._ahead: _Staged | None = None  # taken (maybe prepared) while the device ran
        self._current: _Staged | None = None  # being prepared or on the device
        self._running: Batch = ()  # being prepared, on the device, or waiting to finish
        self._finishing: Batch = ()  # being encoded and delivered
        self._finishing_model: LoadedModel | None = None
        self._finisher: asyncio.Task[None] | None = None
        self._busy_until = -math.inf  # (clock) when the running batch should leave the device

    def held(self) -> list[Job]:
        ahead = self._ahead.jobs if self._ahead is not None else ()
        return [*self._finishing, *self._running, *ahead, *self._parked]

    def holds(self, model: LoadedModel) -> bool:
        """Whether a batch prepared with ``model`` is still on its way through."""
        staged = (self._ahead, self._current)
        return self._finishing_model is model or any(
            s is not None and s.model is model for s in staged
        )

    def free_at(self, now: float) -> float:
        """When (clock) the device should be done with the batches it has taken: the
        running one, then the one taken ahead, at the measured pace (untimed: no time)."""
        free = max(now, self._busy_until)
        if self._ahead is not None:
            free += self._expected_s(self._ahead.jobs)
        return free

    def _expected_s(self, jobs: Sequence[Job]) -> float:
        if not jobs:
            return 0.0
        return self.pace.batch_s(jobs[0].model, estimated(jobs)) or 0.0

    def shutdown(self) -> None:
        if self._finisher is not None:
            self._finisher.cancel()
        for task in self._parking:
            task.cancel()
        self._ahead, self._current, self._running, self._finishing = None, None, (), ()
        self._finishing_model, self._parked = None, []
        self._host.close()
        self._device.close()

    async def run(self, ready: Handoff) -> None:
        """The runner loop: take each formed batch from ``ready`` and see it through."""
        try:
            while True:
                await self._run_next(ready)
        finally:
            await cancel_and_wait(self._finisher)

    async def _run_next(self, ready: Handoff) -> None:
        """One batch, in a frame of its own: nothing of it (its model's runtime included,
        which an eviction must free) outlives it in the loop's locals."""
        staged, self._ahead = self._ahead or _Staged(await ready.take()), None
        self._running, self._current = staged.jobs, staged
        self._busy_until = self.clock() + self._expected_s(staged.jobs)
        prepared = await self._prepared(staged)
        if prepared is None or staged.model is None:
            self._current = None
            staged.trace.end()
            return
        model = staged.model
        started, now = time.perf_counter(), self.clock()
        running = [job for job, _, _ in prepared.items]
        self._busy_until = now + self._expected_s(running)
        forward = asyncio.ensure_future(self._forward(prepared, model, staged.trace))
        await self._take_ahead(ready, forward, started, model.spec.name, estimated(running))
        try:
            forwarded = await forward
        except Exception as exc:  # forward_batch classifies model errors: a bug
            log.exception("batch on %s crashed", model.spec.name)
            error = InferenceFailed(f"the worker failed on this batch: {exc!r}")
            forwarded = Forwarded(prepared, None, error, 0, 0.0)
        if forwarded.waiting and self.put_back is not None:
            self._park(forwarded.waiting)
            forwarded = dataclasses.replace(forwarded, waiting=())
        if forwarded.tokens:  # a pass that failed says nothing of the pace
            self.pace.timed_device(model.spec.name, forwarded.inference_s, estimated(running))
        await self._finish_later(model, forwarded, now, staged.trace)

    def _park(self, waiting: Sequence[tuple[Job, AdapterBuilding]]) -> None:
        """Hold jobs whose adapter is being built until the build ends, or the first of
        their deadlines passes, then put them back to be batched again (an expired one is
        then dropped with its 504, a failed build's error reaches the rest when the adapter
        is next loaded). The device thread never waits for a build, and a request that
        can still run in time is not failed for it."""
        jobs = [job for job, _ in waiting]
        builds = list({id(e.ready): e.ready for _, e in waiting if e.ready is not None}.values())
        self._parked.extend(jobs)
        task = asyncio.create_task(self._unpark(jobs, builds))
        self._parking.add(task)
        task.add_done_callback(self._parking.discard)

    async def _unpark(self, jobs: list[Job], builds: list[Future[Any]]) -> None:
        left_s = min(job.deadline for job in jobs) - self.clock()
        timeout = max(0.0, left_s) if math.isfinite(left_s) else None
        waits = [asyncio.wrap_future(build) for build in builds]
        try:
            if waits:
                done, _ = await asyncio.wait(waits, timeout=timeout)
                for wait in done:
                    wait.exception()  # a failed build's error reaches the jobs via their load
            else:  # no build to watch (not expected): look again shortly
                await asyncio.sleep(min(timeout or PARKED_RETRY_S, PARKED_RETRY_S))
        finally:
            for wait in waits:
                wait.cancel()  # only the wrapper: a started build runs on regardless
        leaving = {job.id for job in jobs}
        self._parked = [job for job in self._parked if job.id not in leaving]
        assert self.put_back is not None, "jobs are parked only where they can be put back"
        self.put_back(jobs)

    async def _forward(
        self, prepared: Prepared, model: LoadedModel, trace: tracing.BatchSpans
    ) -> Forwarded:
        """The device's part, in a turn of the device shared with generation."""
        deadline = min((job.deadline for job, _, _ in prepared.items), default=0.0)
        async with self.turns.turn("embed", deadline):
            with trace.forward(len(prepared.items)):
                return await self._device.call(forward_batch, prepared, model)

    async def _prepared(self, staged: _Staged) -> Prepared | None:
        """The batch decoded and tokenized, less the jobs withdrawn by now; None if none
        is left to run."""
        prepared = staged.prepared
        if prepared is None:
            live = self._live(staged.jobs)
            if not live:
                return None
            prepared = await self._prepare(live, staged)
        withdrawn = self.queue.cancelled(job.id for job, _, _ in prepared.items)
        prepared = prepared.without(withdrawn)
        if not prepared.items and not prepared.failed:
            return None
        return prepared

    def _live(self, jobs: Batch) -> Batch:
        withdrawn = self.queue.cancelled(job.id for job in jobs)
        return tuple(job for job in jobs if job.id not in withdrawn)

    async def _prepare(self, jobs: Batch, staged: _Staged) -> Prepared:
        model = staged.model = self.models[jobs[0].model]
        start = time.perf_counter()
        try:
            prepared = await self._host.call(prepare_batch, jobs, model, self.request_limits)
        except Exception as exc:  # prepare_batch classifies bad input: this is a bug
            log.exception("preparing a batch on %s crashed", model.spec.name)
            error = InferenceFailed(f"the worker failed on this batch: {exc!r}")
            return Prepared([], [(job, error) for job in jobs])
        self.pace.timed_prepare(time.perf_counter() - start, estimated(jobs))
        return prepared

    async def _take_ahead(
        self,
        ready: Handoff,
        forward: asyncio.Future[Forwarded],
        started: float,
        running_model: str,
        running_tokens: int,
    ) -> None:
        """While the device runs: ask for the next batch when the pace says (about this
        one's size is the guess for the next), so it is formed and prepared as the device
        frees."""
        lead = self.pace.lead_s(running_model, running_tokens, running_tokens)
        if lead is not None:
            delay = started + lead - time.perf_counter()
            if delay > 0:
                await asyncio.wait({forward}, timeout=delay)
        if forward.done():
            return  # the device is free first: the loop takes the next batch
        getter: asyncio.Future[Batch] = asyncio.ensure_future(ready.take())
        waiting: set[asyncio.Future[Any]] = {getter, forward}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()  # the batch, once formed, waits for the loop's own take
            return
        live = self._live(getter.result())
        staged = self._ahead = _Staged(live)
        if live and lead is not None:  # untimed, it waits its turn unprepared
            staged.prepared = await self._prepare(live, staged)

    async def _finish_later(
        self,
        model: LoadedModel,
        forwarded: Forwarded,
        now: float,
        trace: tracing.BatchSpans,
    ) -> None:
        """Encode and deliver this batch on the host thread while the device moves on;
        one batch finishes at a time, in order."""
        if self._finisher is not None:
            await self._finisher
        jobs = self._running
        self._finishing, self._running = jobs, ()
        self._finishing_model, self._current = model, None
        self._finisher = asyncio.create_task(self._finish(model, forwarded, now, trace))

    async def _finish(
        self,
        model: LoadedModel,
        forwarded: Forwarded,
        now: float,
        trace: tracing.BatchSpans,
    ) -> None:
        try:
            report = await self._host.call(finish_batch, forwarded, model, now)
        except Exception as exc:  # finish_batch classifies encoding errors: this is a bug
            log.exception("encoding a batch on %s crashed", model.spec.name)
            error = InferenceFailed(f"the worker failed on this batch: {exc!r}")
            jobs = [job for job, _, _ in forwarded.prepared.items]
            report = BatchReport(
                [*forwarded.prepared.failed, *((job, error) for job in jobs)], 0, 0.0
            )
        await self._deliver(model, report, trace)
        trace.end()
        self._finishing, self._finishing_model = (), None

    async def _deliver(
        self, model: LoadedModel, report: BatchReport, trace: tracing.BatchSpans
    ) -> None:
        name = model.spec.name
        if report.tokens:
            metrics.BATCH_TOKENS.labels(name).observe(report.tokens)
            metrics.BATCH_REQUESTS.labels(name).observe(len(report.outcomes))
            metrics.INFERENCE_SECONDS.labels(name).observe(report.inference_s)
            metrics.TOKENS.labels(name).inc(report.tokens)
        self.delivered(name, [job for job, _ in report.outcomes])
        for job, outcome in report.outcomes:
            outcome_label = type(outcome).__name__ if isinstance(outcome, FlotillaError) else "ok"
            metrics.JOBS.labels(name, outcome_label).inc()
            with trace.reply(job, outcome):
                await self.queue.complete(job.id, outcome)
