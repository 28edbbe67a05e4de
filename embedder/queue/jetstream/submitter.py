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
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from prometheus_client import Counter as MetricCounter

from embedder.core.errors import DeadlineExceeded, InferenceFailed, LimitExceeded, NotReady
from embedder.core.jobs import Job, JobResult
from embedder.core.lifecycle import Lifecycle
from embedder.queue.jetstream import wire
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.security import NatsSecurity, open_connection
from embedder.queue.jetstream.streams import ensure_streams
from embedder.queue.protocol import Partial, ReplyStream, resolve

log = logging.getLogger(__name__)

REPLIES = MetricCounter(
    "flotilla_jetstream_replies",
    "Replies read by this gateway: 'delivered' to a waiting request, or 'dropped' "
    "(a duplicate after a redelivery, or its request already gave up).",
    ["outcome"],
)


async def connect(url: str, name: str, security: NatsSecurity | None = None) -> Client:
    """A connection that reconnects for as long as it takes: a request waiting meanwhile
    is bounded by its own deadline, not by the connection. One the server refuses for its
    ``security`` (TLS, credentials) fails at once, naming the setting."""
    return await open_connection(
        url,
        security or NatsSecurity(),
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
    )


class JetStreamSubmitter(Lifecycle):
    """``put`` publishes the job (acknowledged by the stream) and returns a future; the
    reply on ``inbox`` resolves it."""

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
        self.security = security
        self.clock = clock
        self.dropped_replies = 0
        self._waiters: dict[str, tuple[asyncio.Future[JobResult], str]] = {}
        self._streams: dict[str, _Reassembly] = {}
        self._announcing: set[asyncio.Future[None]] = set()
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._sub: Subscription | None = None

    async def start(self) -> None:
        if self._nc is not None:
            return
        nc = await connect(self.url, f"flotilla-gateway {self.inbox}", self.security)
        try:
            js = nc.jetstream()
            await ensure_streams(js, self.config)
            self._sub = await nc.subscribe(self.inbox, cb=self._on_reply)
            await nc.flush()  # subscribed on the server before the first request goes out
        except BaseException:
            await nc.close()
            raise
        self._nc, self._js = nc, js

    async def stop(self) -> None:
        nc, self._nc = self._nc, None
        if nc is None:
            return
        for future, _ in list(self._waiters.values()):
            if not future.done():
                future.set_exception(NotReady("the gateway is shutting down"))
        await nc.close()

    async def put(self, job: Job) -> asyncio.Future[JobResult]:
        if self._nc is None or self._js is None:
            raise NotReady("the JetStream work queue is not started")
        if job.id in self._waiters:
            raise ValueError(f"job id {job.id!r} is already queued")
        limit = min(self.config.max_message_bytes, self._nc.max_payload)
        if len(job.body) > limit:
            raise LimitExceeded(
                f"the request is over {limit} bytes, the largest message the work queue "
                "takes: split it, or raise --nats-max-message-bytes (and the server's "
                "max_payload)"
            )
        future: asyncio.Future[JobResult] = asyncio.get_running_loop().create_future()
        self._waiters[job.id] = (future, job.model)
        future.add_done_callback(functools.partial(self._forget, job.id))
        remaining = job.deadline - self.clock()
        try:
            if remaining <= 0:
                raise TimeoutError
            # The stream's acknowledgement: the job is stored, so a worker will see it.
            await self._js.publish(
                self.config.subject(job.model),
                job.body,
                timeout=remaining,
                headers=wire.encode_job(job, self.inbox),
            )
        except (TimeoutError, nats.errors.TimeoutError):
            self._withdraw(job.id, future)
            raise DeadlineExceeded(
                "the work queue (JetStream) did not take the request in time"
            ) from None
        except MaxPayloadError:
            self._withdraw(job.id, future)
            raise LimitExceeded(
                "the request is over the NATS server's max_payload: split it"
            ) from None
        except NatsError as exc:
            self._withdraw(job.id, future)
            raise NotReady(f"the work queue (JetStream) refused the request: {exc!r}") from exc
        future.add_done_callback(functools.partial(self._announce_withdrawal, job.id))
        return future

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
        if future.cancelled() and self._nc is not None and not self._nc.is_closed:
            task = asyncio.ensure_future(self._publish_withdrawal(job_id))
            self._announcing.add(task)
            task.add_done_callback(self._announcing.discard)

    async def _publish_withdrawal(self, job_id: str) -> None:
        try:
            assert self._nc is not None
            await self._nc.publish(self.config.withdrawn_subject, job_id.encode())
        except (NatsError, AssertionError) as exc:  # the job then runs on to its end
            log.warning("could not announce that %s was withdrawn: %r", job_id, exc)

    def depth(self) -> Counter[str]:
        """This gateway's jobs without a reply yet, per model (queued or running)."""
        return Counter(model for _, model in self._waiters.values())

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
