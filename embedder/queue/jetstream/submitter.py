"""The gateway's half of the JetStream work queue (the whole is described in
``embedder.queue.jetstream``): publish each job on its model's subject, and resolve its
future from the replies that reach this gateway's own inbox subject."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable

import nats
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.errors import MaxPayloadError
from prometheus_client import Counter as MetricCounter

from embedder.core.errors import DeadlineExceeded, InferenceFailed, LimitExceeded, NotReady
from embedder.core.jobs import Job, JobResult
from embedder.core.lifecycle import Lifecycle
from embedder.queue.jetstream import wire
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.connection import UNREACHABLE, Connection, missing
from embedder.queue.jetstream.security import NatsSecurity
from embedder.queue.jetstream.streams import ensure_streams
from embedder.queue.protocol import Partial, ReplyStream, resolve

log = logging.getLogger(__name__)

REPLIES = MetricCounter(
    "flotilla_jetstream_replies",
    "Replies read by this gateway: 'delivered' to a waiting request, or 'dropped' "
    "(a duplicate after a redelivery, or its request already gave up).",
    ["outcome"],
)


FIRST_RETRY_S = 0.05  # between offers of a job to a stream that takes none; doubles up to
MAX_RETRY_S = 0.5


class _TryAgain(Exception):
    """A publish the stream may take in a moment; ``error`` is the answer if it does not."""

    def __init__(self, error: NotReady) -> None:
        super().__init__(error.message)
        self.error = error


class JetStreamSubmitter(Lifecycle):
    """``put`` publishes the job (acknowledged by the stream) and returns a future; the
    reply on ``inbox`` resolves it.

    While the broker is unreachable ``put`` refuses at once (``NotReady``, 503 with
    Retry-After), and a publish the stream does not confirm within
    ``config.publish_timeout_s`` is refused too: a client hears in a moment, not at its
    deadline. After a reconnect every job still waiting is published again
    (``_publish_again``)."""

    def __init__(
        self,
        *,
        url: str,
        inbox: str,
        config: JetStreamConfig | None = None,
        clock: Callable[[], float] = time.time,
        security: NatsSecurity | None = None,
    ) -> None:
        self.url = url
        self.inbox = inbox
        self.config = config or JetStreamConfig()
        self.clock = clock
        self.dropped_replies = 0
        self._waiters: dict[str, tuple[asyncio.Future[JobResult], Job]] = {}
        self._streams: dict[str, _Reassembly] = {}
        self._announcing: set[asyncio.Future[None]] = set()
        self._link = Connection(url, f"flotilla-gateway {inbox}", self._establish, security)
        self._sub: Subscription | None = None
        self._rounds = 0  # times the jobs waiting were published again

    async def start(self) -> None:
        await self._link.open()

    async def stop(self) -> None:
        if not self._link.opened:
            return
        for future, _ in list(self._waiters.values()):
            if not future.done():
                future.set_exception(NotReady("the gateway is shutting down"))
        await self._link.close()
        self._sub = None  # with the connection

    async def _establish(self) -> None:
        """The streams (a restarted server may have lost them), the reply inbox (the client
        replays it after a reconnect) confirmed on the server, then the jobs waiting
        published again: all that was waited for is in the stream, and its replies come."""
        await ensure_streams(self._link.js, self.config)
        if self._sub is None:
            self._sub = await self._link.nc.subscribe(self.inbox, cb=self._on_reply)
        await self._link.nc.flush()  # subscribed on the server before a request goes out
        await self._publish_again()

    async def _publish_again(self) -> None:
        """Every job still waiting, once more under a new message id (the old one may be
        deduplicated). Its reply may have been sent while this gateway's inbox was not
        subscribed, which core NATS drops for good, or the stream lost it (memory storage):
        a job is run twice rather than lost, and the first reply wins."""
        now = self.clock()
        waiting = [job for future, job in self._waiters.values() if not future.done()]
        waiting = [job for job in waiting if job.deadline > now]
        if not waiting:
            return
        self._rounds += 1
        log.warning("publishing the %d requests still waiting again", len(waiting))
        await asyncio.gather(
            *(
                self._link.js.publish(
                    self._subject(job),
                    job.body,
                    timeout=min(self.config.publish_timeout_s, job.deadline - now),
                    headers={
                        **wire.encode_job(job, self.inbox),
                        wire.MSG_ID: f"{job.id}.again-{self._rounds}",
                    },
                )
                for job in waiting
            )
        )

    def _subject(self, job: Job) -> str:
        """The job's lane of its model's queue, by its whole budget (a job published again
        keeps its lane)."""
        lane = self.config.lane_of(job.model, job.budget_s)
        return self.config.lane_subject(lane)

    async def put(self, job: Job) -> asyncio.Future[JobResult]:
        if not self._link.opened:
            raise NotReady("the JetStream work queue is not started")
        if not self._link.connected:
            raise NotReady(f"{UNREACHABLE}: the request was not queued; retry shortly")
        if job.id in self._waiters:
            raise ValueError(f"job id {job.id!r} is already queued")
        limit = min(self.config.max_message_bytes, self._link.nc.max_payload)
        if len(job.body) > limit:
            raise LimitExceeded(
                f"the request is over {limit} bytes, the largest message the work queue "
                "takes: split it, or raise --nats-max-message-bytes (and the server's "
                "max_payload)"
            )
        if job.deadline <= self.clock():
            raise DeadlineExceeded("the work queue (JetStream) did not take the request in time")
        future: asyncio.Future[JobResult] = asyncio.get_running_loop().create_future()
        self._waiters[job.id] = (future, job)
        future.add_done_callback(functools.partial(self._forget, job.id))
        try:
            await self._publish(job)
        except BaseException:
            self._withdraw(job.id, future)
            raise
        future.add_done_callback(functools.partial(self._announce_withdrawal, job.id))
        return future

    async def _publish(self, job: Job) -> None:
        """The job into the stream, confirmed (a worker will see it), or the error that
        says why not. A stream that takes nothing for a moment (a replicated stream
        electing its next leader after a server is lost, or being made again; a publish
        cut off with the server it went to) is offered the job again, under the same
        message id so it is stored once, for up to ``failover_s``; the broker's silence on
        a connection that held is a 503 at once, the request's own deadline a 504."""
        give_up = min(self.clock() + self.config.failover_s, job.deadline)
        pause = FIRST_RETRY_S
        while True:
            try:
                return await self._publish_once(job)
            except _TryAgain as failed:
                if not self._link.connected or self.clock() + pause >= give_up:
                    raise failed.error from None
            await asyncio.sleep(pause)
            pause = min(2 * pause, MAX_RETRY_S)

    async def _publish_once(self, job: Job) -> None:
        remaining = job.deadline - self.clock()
        bound = min(remaining, self.config.publish_timeout_s)
        reconnects = self._link.reconnects
        try:
            await self._link.js.publish(
                self._subject(job),
                job.body,
                timeout=bound,
                headers=wire.encode_job(job, self.inbox),
            )
        except (TimeoutError, nats.errors.TimeoutError):
            if bound >= remaining:
                raise DeadlineExceeded(
                    "the work queue (JetStream) did not take the request in time"
                ) from None
            refused = NotReady(
                f"the queue broker (NATS) did not confirm the request within {bound:g} s "
                "(--nats-publish-timeout-s): it is unreachable or overloaded; retry shortly"
            )
            if self._link.reconnects != reconnects:  # lost with its server, not stalled
                raise _TryAgain(refused) from None
            raise refused from None
        except MaxPayloadError:
            raise LimitExceeded(
                "the request is over the NATS server's max_payload: split it"
            ) from None
        except NatsError as exc:
            refused = NotReady(f"the work queue (JetStream) refused the request: {exc!r}")
            if missing(exc):
                self._link.renew()  # the server lost the stream: made again meanwhile
                raise _TryAgain(refused) from exc
            raise refused from exc

    async def put_streaming(self, job: Job) -> ReplyStream:
        stream = ReplyStream(await self.put(job))
        self._streams[job.id] = _Reassembly(stream)
        return stream

    def _withdraw(self, job_id: str, future: asyncio.Future[JobResult]) -> None:
        """A job that never reached the stream: gone from depth() now, not a turn later."""
        future.cancel()
        self._forget(job_id, future)

    def _forget(self, job_id: str, future: asyncio.Future[JobResult]) -> None:
        entry = self._waiters.get(job_id)
        if entry is not None and entry[0] is future:
            del self._waiters[job_id]
        parts = self._streams.get(job_id)
        if parts is not None and parts.stream.future is future:
            del self._streams[job_id]

    def _announce_withdrawal(self, job_id: str, future: asyncio.Future[JobResult]) -> None:
        """A queued job the gateway cancelled (its client left): tell the workers, so the
        one holding it stops at its next step instead of generating for nobody."""
        if future.cancelled() and self._link.connected:
            task = asyncio.ensure_future(self._publish_withdrawal(job_id))
            self._announcing.add(task)
            task.add_done_callback(self._announcing.discard)

    async def _publish_withdrawal(self, job_id: str) -> None:
        try:
            await self._link.nc.publish(self.config.withdrawn_subject, job_id.encode())
        except (NatsError, AssertionError) as exc:  # the job then runs on to its end
            log.warning("could not announce that %s was withdrawn: %r", job_id, exc)

    def depth(self) -> Counter[str]:
        """This gateway's jobs without a reply yet, per model (queued or running)."""
        return Counter(job.model for _, job in self._waiters.values())

    async def _on_reply(self, msg: Msg) -> None:
        job_id = wire.reply_id(msg.headers) or ""
        try:
            part = wire.decode_partial(msg.headers, msg.data)
        except wire.MalformedRecord:
            part = None  # read as the outcome below, which then fails to decode
        if part is not None:
            parts = self._streams.get(job_id)
            if parts is None or not parts.add(part):
                REPLIES.labels("dropped").inc()
            return
        entry = self._waiters.pop(job_id, None)
        if entry is None or entry[0].done():
            self.dropped_replies += 1
            REPLIES.labels("dropped").inc()
            return
        try:
            outcome = wire.decode_outcome(msg.headers, msg.data)
        except wire.MalformedRecord as exc:
            outcome = InferenceFailed(f"the worker's reply could not be read: {exc}")
        resolve(entry[0], outcome)
        REPLIES.labels("delivered").inc()


class _Reassembly:
    """A streamed job's parts in ``seq`` order: a part ahead of its turn waits for the
    ones before it, a part seen before (a redelivered job answered again) is dropped."""

    def __init__(self, stream: ReplyStream) -> None:
        self.stream = stream
        self.next_seq = 0
        self.ahead: dict[int, Partial] = {}

    def add(self, part: Partial) -> bool:
        if part.seq < self.next_seq or part.seq in self.ahead:
            return False
        self.ahead[part.seq] = part
        while self.next_seq in self.ahead:
            self.stream.push(self.ahead.pop(self.next_seq))
            self.next_seq += 1
        return True
