"""The worker's half of the JetStream work queue (the whole is described in
``embedder.queue.jetstream``): take about a token budget of what ``fetcher`` reads,
hand back what does not fit or cannot be finished in time, reply, and ack only what is
answered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from embedder.core.errors import LimitExceeded
from embedder.core.jobs import Job
from embedder.core.lifecycle import Lifecycle, cancel_and_wait, watch
from embedder.queue.jetstream import wire
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.connection import Connection
from embedder.queue.jetstream.dead_letters import DeadLetters
from embedder.queue.jetstream.fetcher import HANDED_ON, HANDLED, Fetcher
from embedder.queue.jetstream.security import NatsSecurity
from embedder.queue.jetstream.streams import ensure_streams
from embedder.queue.protocol import Outcome, Partial
from embedder.tasks.embed.batching import take_within, urgency

log = logging.getLogger(__name__)

TAKEN = HANDLED.labels("taken")
HANDED_BACK = HANDLED.labels("handed_back")
HANDED_BACK_LATE = HANDLED.labels("handed_back_late")
WITHDRAWN = HANDLED.labels("withdrawn")
MAX_FETCH = 64  # messages asked for in one fetch, however small the jobs
FIRST_GUESS_TOKENS = 64.0  # tokens per job assumed before any was seen


@dataclass(slots=True)
class _Held:
    msg: Msg
    reply_to: str
    deadline: float


class JetStreamPuller(Lifecycle):
    """The worker's ``JobPuller``, reading through a ``fetcher.Fetcher`` (one pull
    subscription per model, bound to the durable consumer all that model's workers share).

    A fetch asks for about ``max_tokens`` worth of messages, guessed from the sizes seen
    so far; what still does not fit is nak'ed with ``nak_delay_ms`` so another worker
    takes it. Jobs the worker hands back (``hand_back``: it cannot finish them in time)
    are nak'ed without delay. Jobs in hand are kept from redelivery while their
    deadline lasts (an in-progress ack every third of ``ack_wait``): only a worker that
    stops answering loses them, after ``ack_wait``.
    """

    def __init__(
        self,
        *,
        url: str,
        config: JetStreamConfig | None = None,
        name: str = "flotilla-worker",
        clock: Callable[[], float] = time.time,
        security: NatsSecurity | None = None,
    ) -> None:
        self.url = url
        self.config = config or JetStreamConfig()
        self.name = name
        self.clock = clock
        self._link = Connection(url, name, self._establish, security)
        self._fetcher: Fetcher | None = None
        self._held: dict[str, _Held] = {}
        self._tokens_per_job = FIRST_GUESS_TOKENS
        self._serving = False
        self._answers = True
        self._released = asyncio.Event()
        self._keepalive: asyncio.Task[None] | None = None
        self._dead: DeadLetters | None = None
        self._taken_at: dict[str, float] = {}  # model -> when a pull last took its jobs

    async def start(self) -> None:
        if self._link.opened:
            return
        await self._link.open()
        nc = self._link.nc
        try:
            self._dead = DeadLetters(nc, self._link.js, self.config)
            await self._dead.start()
            await nc.subscribe(self.config.withdrawn_subject, cb=self._on_withdrawn)
        except BaseException:
            await self._link.close()
            raise
        self._fetcher = Fetcher(self._link, self.config)
        self._serving = True
        self._keepalive = watch(asyncio.create_task(self._keep_alive(), name="jetstream-wpi"))

    async def _establish(self) -> None:
        """The streams and the consumers of the models pulled so far, made again where a
        restarted server lost them (memory storage). The withdrawals and dead-letter
        advisories are core subscriptions, which the client replays itself."""
        await ensure_streams(self._link.js, self.config)
        if self._fetcher is not None:
            await self._fetcher.ensure_consumers()

    async def stop(self) -> None:
        """Hand back what is still held (another worker takes it at once) and close."""
        if not self._link.opened:
            return
        self._serving = False
        await cancel_and_wait(self._keepalive)
        if self._fetcher is not None:
            await self._fetcher.close()
        await self._hand_back_held()
        if self._dead is not None:
            await self._dead.stop()
        with contextlib.suppress(NatsError, TimeoutError):
            await self._link.nc.flush(timeout=5)  # the acks and replies still buffered go out first
        await self._link.close()

    async def drain(self, timeout_s: float) -> int:
        """Stop fetching and wait until the jobs in hand are answered; those still
        unanswered after ``timeout_s`` are handed back and their answers dropped.
        Returns how many were handed back."""
        self._serving = False
        deadline = time.monotonic() + timeout_s
        while self._held and (remaining := deadline - time.monotonic()) > 0:
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._released.wait()
        left = len(self._held)
        self._answers = False
        if self._fetcher is not None:
            await self._fetcher.close()
        await self._hand_back_held()
        return left

    def in_hand(self) -> int:
        return len(self._held)

    def taken_at(self, model: str) -> float | None:
        """When (``clock``) a pull last took jobs of ``model``: its last use here, however
        quickly they were answered."""
        return self._taken_at.get(model)

    async def waiting(self, models: Collection[str]) -> dict[str, int]:
        """Each model's requests not yet answered (``Fetcher.waiting``); {} while the
        broker is unreachable."""
        if self._fetcher is None or not self._link.connected:
            return {}
        try:
            return await self._fetcher.waiting(models)
        except (NatsError, TimeoutError) as exc:
            log.debug("the queue's counts are unknown: %r", exc)
            return {}

    # -- JobPuller ---------------------------------------------------------------------

    async def pull(self, models: Collection[str], max_tokens: int, timeout_s: float) -> list[Job]:
        if not self._serving or not models or self._fetcher is None or not self._link.connected:
            # Nothing to fetch, or the broker unreachable: a fetch would only be buffered
            # by the client. The loop comes back within ``timeout_s``, a reconnect too.
            await asyncio.sleep(timeout_s)
            return []
        batch = max(1, min(MAX_FETCH, int(max_tokens / self._tokens_per_job)))
        messages = await self._fetcher.fetch(models, batch, timeout_s)
        now = self.clock()
        jobs = [job for msg in messages if (job := await self._admit(msg, now)) is not None]
        # A fetch left open by an earlier pull may bring a model no longer asked for (one
        # evicted since): back at once, for a worker that hosts it.
        for job in [job for job in jobs if job.model not in models]:
            stray = self._held.pop(job.id)
            HANDED_ON.inc()
            with contextlib.suppress(NatsError):
                await stray.msg.nak()
        jobs = [job for job in jobs if job.model in models]
        if jobs:
            sizes = sum(job.est_tokens for job in jobs) / len(jobs)
            self._tokens_per_job = 0.8 * self._tokens_per_job + 0.2 * max(1.0, sizes)
        jobs.sort(key=urgency)
        taken = take_within(jobs, max_tokens)
        for job in jobs[len(taken) :]:
            held = self._held.pop(job.id)
            HANDED_BACK.inc()
            with contextlib.suppress(NatsError):
                await held.msg.nak(delay=self.config.nak_delay_ms / 1e3)
        TAKEN.inc(len(taken))
        for job in taken:
            self._taken_at[job.model] = now
        return taken

    async def hand_back(self, jobs: Sequence[Job]) -> None:
        """Back to the queue without delay, for a worker asking now: this one cannot
        finish them in time. The server counts the next delivery (``deliveries`` one
        higher); a job answered or withdrawn meanwhile is no longer held, so skipped."""
        for job in jobs:
            held = self._held.pop(job.id, None)
            if held is None:
                continue
            HANDED_BACK_LATE.inc()
            with contextlib.suppress(NatsError):
                await held.msg.nak()
        self._released.set()

    async def complete(self, job_id: str, outcome: Outcome) -> None:
        held = self._held.pop(job_id, None)
        if held is None:
            return
        self._released.set()
        if not self._answers or not self._link.opened:
            return
        nc = self._link.nc
        payload, headers = wire.encode_outcome(job_id, outcome)
        if len(payload) > nc.max_payload:
            payload, headers = wire.encode_outcome(
                job_id,
                LimitExceeded(
                    f"the response is over {nc.max_payload} bytes, the NATS server's "
                    "max_payload: ask for fewer inputs, or raise the server's max_payload"
                ),
            )
        try:
            # While the broker is unreachable the client buffers both: a reply lost for want
            # of a subscribed gateway is made good by the gateway publishing the job again.
            await nc.publish(held.reply_to, payload, headers=headers)
            # After the reply, on the same connection: the server has the reply before
            # the ack, so an acked job is never one whose answer was lost.
            await held.msg.ack()
        except NatsError as exc:
            log.warning("reply for %s failed (redelivered after ack_wait): %r", job_id, exc)

    async def partial(self, job_id: str, partial: Partial) -> bool:
        """Publish a part of a streamed answer to the job's reply subject, on the same
        connection as its outcome will go: the gateway reads them in order."""
        held = self._held.get(job_id)
        if held is None or not self._answers or not self._link.opened:
            return False
        payload, headers = wire.encode_partial(job_id, partial)
        try:
            await self._link.nc.publish(held.reply_to, payload, headers=headers)
        except NatsError as exc:  # the part is lost; the outcome still comes
            log.warning("part %d of %s failed: %r", partial.seq, job_id, exc)
        return True

    async def _on_withdrawn(self, msg: Msg) -> None:
        """A gateway's client left: the job is done for the queue (acked, so it is never
        redelivered) and ``cancelled`` names it, so its engine stops it."""
        held = self._held.pop(msg.data.decode(errors="replace"), None)
        if held is None:
            return  # another worker's, or already answered
        WITHDRAWN.inc()
        self._released.set()
        with contextlib.suppress(NatsError):
            await held.msg.ack()

    def cancelled(self, job_ids: Iterable[str]) -> set[str]:
        """Jobs this worker no longer answers for: unknown (handed back) or abandoned."""
        return {job_id for job_id in job_ids if not self._answers or job_id not in self._held}

    async def _admit(self, msg: Msg, now: float) -> Job | None:
        try:
            job, reply_to = wire.decode_job(msg.headers, msg.data, msg.metadata.num_delivered)
        except wire.MalformedRecord as exc:
            log.warning("terminating a request that is not one: %s", exc)
            HANDLED.labels("malformed").inc()
            await msg.term()
            return None
        if job.deadline <= now:  # its gateway has answered 504 already
            HANDLED.labels("expired").inc()
            await msg.term()
            return None
        held = self._held.get(job.id)
        if held is not None:
            if held.msg.metadata.sequence.stream == msg.metadata.sequence.stream:
                held.msg = msg  # redelivered while still in hand: this delivery's ack counts
            else:
                # A copy its gateway published again after a reconnect: the one in hand
                # answers for both, so the copy leaves the queue now.
                with contextlib.suppress(NatsError):
                    await msg.ack()
            return None
        self._held[job.id] = _Held(msg, reply_to, job.deadline)
        if self._fetcher is not None:
            lane = self.config.lane_of(job.model, job.budget_s)
            self._fetcher.saw_deadline(lane, job.deadline)
        return job

    async def _hand_back_held(self) -> None:
        held, self._held = list(self._held.values()), {}
        for entry in held:
            with contextlib.suppress(NatsError):
                await entry.msg.nak()
        self._released.set()

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.config.ack_wait_s / 3)
            if not self._link.connected:
                continue  # a restarted server starts the ack wait afresh anyway
            now = self.clock()
            for entry in list(self._held.values()):
                if entry.deadline > now:
                    with contextlib.suppress(NatsError):
                        await entry.msg.in_progress()
