"""The worker's half of the JetStream work queue (the whole is described in
``embedder.queue.jetstream``): fetch about a token budget from the durable consumer of
each model served, hand back what does not fit, reply, and ack only what is answered."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from prometheus_client import Counter as MetricCounter

from embedder.core.errors import LimitExceeded
from embedder.core.jobs import Job
from embedder.core.lifecycle import Lifecycle, cancel_and_wait, watch
from embedder.queue.jetstream import wire
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.dead_letters import DeadLetters
from embedder.queue.jetstream.streams import ensure_consumer, ensure_streams
from embedder.queue.jetstream.submitter import connect
from embedder.queue.protocol import Outcome, Partial
from embedder.tasks.embed.batching import take_within, urgency

log = logging.getLogger(__name__)

HANDLED = MetricCounter(
    "flotilla_jetstream_requests",
    "Request messages a worker fetched, by what became of them: 'taken', 'handed_back' "
    "(nak: over the token budget), 'handed_on' (nak: fetched for another model while this "
    "worker ran a batch), 'withdrawn' (acked unanswered: the gateway's client left), "
    "'expired' and 'malformed' (both terminated).",
    ["outcome"],
)
TAKEN = HANDLED.labels("taken")
HANDED_BACK = HANDLED.labels("handed_back")
HANDED_ON = HANDLED.labels("handed_on")
WITHDRAWN = HANDLED.labels("withdrawn")
MAX_FETCH = 64  # messages asked for in one fetch, however small the jobs
FIRST_GUESS_TOKENS = 64.0  # tokens per job assumed before any was seen
# How long a fetch for the rest of a batch may linger on the server: the requests that
# arrive within it go with the batch, the later ones to whichever worker asks first.
REST_WAIT_S = 0.002
# A first request that came within this was already waiting: there may be more, worth
# the fetch for the rest; one that took longer arrived while the worker waited.
BACKLOG_S = 0.005
# How long the fetch for requests the server counts as waiting (the first one's
# ``num_pending``) may take: it ends as soon as they come, so this bounds only a busy
# machine's delivery, or a race with another worker for them.
PENDING_WAIT_S = 0.05


@dataclass(slots=True)
class _Held:
    msg: Msg
    reply_to: str
    deadline: float


class JetStreamPuller(Lifecycle):
    """The worker's ``JobPuller``: one pull subscription per model, bound to the durable
    consumer all that model's workers share.

    A fetch asks for about ``max_tokens`` worth of messages, guessed from the sizes seen
    so far; what still does not fit is nak'ed with ``nak_delay_ms`` so another worker
    takes it. Jobs in hand are kept from redelivery while their deadline lasts (an
    in-progress ack every third of ``ack_wait``): only a worker that stops answering
    loses them, after ``ack_wait``.
    """

    def __init__(
        self,
        *,
        url: str,
        config: JetStreamConfig | None = None,
        name: str = "flotilla-worker",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.config = config or JetStreamConfig()
        self.name = name
        self.clock = clock
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._subs: dict[str, JetStreamContext.PullSubscription] = {}
        self._fetching: dict[JetStreamContext.PullSubscription, asyncio.Future[list[Msg]]] = {}
        self._waiting = False  # a pull is waiting on self._fetching
        self._kept: list[Msg] = []  # brought between pulls, for the next one
        self._handing: set[asyncio.Future[None]] = set()
        self._held: dict[str, _Held] = {}
        self._tokens_per_job = FIRST_GUESS_TOKENS
        self._serving = False
        self._answers = True
        self._released = asyncio.Event()
        self._keepalive: asyncio.Task[None] | None = None
        self._dead: DeadLetters | None = None

    async def start(self) -> None:
        if self._nc is not None:
            return
        nc = await connect(self.url, self.name)
        try:
            js = nc.jetstream()
            await ensure_streams(js, self.config)
            self._dead = DeadLetters(nc, js, self.config)
            await self._dead.start()
            await nc.subscribe(self.config.withdrawn_subject, cb=self._on_withdrawn)
        except BaseException:
            await nc.close()
            raise
        self._nc, self._js = nc, js
        self._serving = True
        self._keepalive = watch(asyncio.create_task(self._keep_alive(), name="jetstream-wpi"))

    async def stop(self) -> None:
        """Hand back what is still held (another worker takes it at once) and close."""
        nc, self._nc = self._nc, None
        if nc is None:
            return
        self._serving = False
        await cancel_and_wait(self._keepalive)
        await self._hand_back_fetching()
        await self._hand_back_held()
        assert self._dead is not None
        await self._dead.stop()
        with contextlib.suppress(NatsError, TimeoutError):
            await nc.flush(timeout=5)  # the acks and replies still buffered go out first
        await nc.close()
        self._subs.clear()

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
        await self._hand_back_fetching()
        await self._hand_back_held()
        return left

    def in_hand(self) -> int:
        return len(self._held)

    # -- JobPuller ---------------------------------------------------------------------

    async def pull(self, models: Collection[str], max_tokens: int, timeout_s: float) -> list[Job]:
        if not self._serving or not models:
            await asyncio.sleep(timeout_s)
            return []
        batch = max(1, min(MAX_FETCH, int(max_tokens / self._tokens_per_job)))
        subs = [await self._subscription(model) for model in models]
        messages = await self._fetch(subs, batch, timeout_s)
        now = self.clock()
        jobs = [job for msg in messages if (job := await self._admit(msg, now)) is not None]
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
        return taken

    async def complete(self, job_id: str, outcome: Outcome) -> None:
        held = self._held.pop(job_id, None)
        if held is None:
            return
        self._released.set()
        if not self._answers or self._nc is None:
            return
        payload, headers = wire.encode_outcome(job_id, outcome)
        if len(payload) > self._nc.max_payload:
            payload, headers = wire.encode_outcome(
                job_id,
                LimitExceeded(
                    f"the response is over {self._nc.max_payload} bytes, the NATS server's "
                    "max_payload: ask for fewer inputs, or raise the server's max_payload"
                ),
            )
        try:
            await self._nc.publish(held.reply_to, payload, headers=headers)
            # After the reply, on the same connection: the server has the reply before
            # the ack, so an acked job is never one whose answer was lost.
            await held.msg.ack()
        except NatsError as exc:
            log.warning("reply for %s failed (redelivered after ack_wait): %r", job_id, exc)

    async def partial(self, job_id: str, partial: Partial) -> bool:
        """Publish a part of a streamed answer to the job's reply subject, on the same
        connection as its outcome will go: the gateway reads them in order."""
        held = self._held.get(job_id)
        if held is None or not self._answers or self._nc is None:
            return False
        payload, headers = wire.encode_partial(job_id, partial)
        try:
            await self._nc.publish(held.reply_to, payload, headers=headers)
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

    # -- reading -----------------------------------------------------------------------

    async def _subscription(self, model: str) -> JetStreamContext.PullSubscription:
        sub = self._subs.get(model)
        if sub is None:
            assert self._js is not None
            durable = await ensure_consumer(self._js, self.config, model)
            sub = await self._js.pull_subscribe_bind(durable=durable, stream=self.config.stream)
            self._subs[model] = sub
        return sub

    async def _fetch(
        self, subs: list[JetStreamContext.PullSubscription], batch: int, timeout_s: float
    ) -> list[Msg]:
        kept, self._kept = self._kept, []
        if len(subs) == 1 and not self._fetching:
            return kept + await self._fetch_one(subs[0], batch, timeout_s)
        # Several models: one fetch per model runs at a time, and the first that brings
        # something ends the wait. The others are left running, never cancelled: a
        # cancelled fetch drops the messages it already took, and those would wait out
        # ``ack_wait`` before redelivery. One that ends while this worker is not pulling
        # (it is running a batch) hands its requests on (``_ended_unasked``).
        for sub in subs:
            if sub not in self._fetching:
                task = asyncio.ensure_future(self._fetch_one(sub, batch, timeout_s))
                task.add_done_callback(functools.partial(self._ended_unasked, sub))
                self._fetching[sub] = task
        if not kept:  # with requests in hand already, take what has come and go
            self._waiting = True
            try:
                await asyncio.wait(
                    self._fetching.values(),
                    timeout=timeout_s + 1.0,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                self._waiting = False
        return kept + self._collect()

    def _ended_unasked(
        self, sub: JetStreamContext.PullSubscription, task: asyncio.Future[list[Msg]]
    ) -> None:
        """A fetch left running brought requests while this worker runs a batch: those
        delivered for the first time go back at once (no delay) to a worker that is
        asking; one already handed on is kept for this worker's next pull, so that no
        request bounces toward ``max_deliver``."""
        if self._waiting or self._fetching.get(sub) is not task or task.cancelled():
            return
        del self._fetching[sub]
        messages = task.result()
        back = [m for m in messages if m.metadata.num_delivered <= 1]
        self._kept.extend(m for m in messages if m.metadata.num_delivered > 1)
        if back:
            HANDED_ON.inc(len(back))
            handing = asyncio.ensure_future(self._nak_all(back))
            self._handing.add(handing)
            handing.add_done_callback(self._handing.discard)

    def _collect(self) -> list[Msg]:
        """The messages of the fetches that have ended."""
        found: list[Msg] = []
        for sub, task in list(self._fetching.items()):
            if task.done():
                del self._fetching[sub]
                found.extend(task.result())
        return found

    @staticmethod
    async def _nak_all(messages: list[Msg]) -> None:
        for msg in messages:
            with contextlib.suppress(NatsError):
                await msg.nak()

    async def _fetch_one(
        self, sub: JetStreamContext.PullSubscription, batch: int, timeout_s: float
    ) -> list[Msg]:
        """The first message as soon as there is one, then up to the rest of ``batch``:
        those the server counts as waiting behind it, or, when none is counted but the
        first came at once, those that arrive within ``REST_WAIT_S``. A pull request outlives its
        fetch on the server until it is filled or expires: asked for a whole batch at
        once, a worker would go on collecting requests into its inbox while it runs the
        first ones, where no free worker can take them."""
        try:
            asked = time.monotonic()
            first = await sub.fetch(1, timeout=max(timeout_s, 0.001))
            waiting = first[-1].metadata.num_pending or 0
            if batch <= len(first):
                return first
            if waiting > 0:  # counted by the server, so asked for whatever the wait took
                rest, wait_s = min(batch - len(first), waiting), PENDING_WAIT_S
            elif time.monotonic() - asked <= BACKLOG_S:  # maybe a burst still arriving
                rest, wait_s = batch - len(first), REST_WAIT_S
            else:
                return first  # it had to wait for one: nothing else is waiting
            try:
                return first + await sub.fetch(rest, timeout=wait_s)
            except TimeoutError:
                return first
        except TimeoutError:
            return []
        except NatsError as exc:
            log.warning("fetching requests failed: %r", exc)
            await asyncio.sleep(timeout_s)
            return []

    async def _admit(self, msg: Msg, now: float) -> Job | None:
        try:
            job, reply_to = wire.decode_job(msg.headers, msg.data)
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
            held.msg = msg  # redelivered while still in hand: this delivery's ack counts
            return None
        self._held[job.id] = _Held(msg, reply_to, job.deadline)
        return job

    async def _hand_back_fetching(self) -> None:
        """Wait for the fetches still running (each ends by its timeout) and hand back
        what they brought, so that nothing waits out ``ack_wait`` on a stopped worker."""
        self._waiting = True  # what they bring is collected here
        try:
            if self._fetching:
                await asyncio.wait(self._fetching.values())
        finally:
            self._waiting = False
        kept, self._kept = self._kept, []
        await self._nak_all(kept + self._collect())
        if self._handing:
            await asyncio.gather(*self._handing)

    async def _hand_back_held(self) -> None:
        held, self._held = list(self._held.values()), {}
        for entry in held:
            with contextlib.suppress(NatsError):
                await entry.msg.nak()
        self._released.set()

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.config.ack_wait_s / 3)
            now = self.clock()
            for entry in list(self._held.values()):
                if entry.deadline > now:
                    with contextlib.suppress(NatsError):
                        await entry.msg.in_progress()
