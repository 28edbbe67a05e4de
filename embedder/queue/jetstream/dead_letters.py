"""Requests the queue gave up on: when a job reaches ``max_deliver`` deliveries without an
ack, the server announces it; one worker of the fleet (a queue group) copies the message
with its reason to the dead-letter stream, removes it from the work queue, and answers
its gateway with ``Undeliverable`` so the client hears at once instead of at its deadline."""

from __future__ import annotations

import json
import logging

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from prometheus_client import Counter as MetricCounter

from embedder.core.errors import Undeliverable
from embedder.core.lifecycle import Lifecycle
from embedder.queue.jetstream import wire
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.streams import MAX_DELIVERIES_ADVISORY

log = logging.getLogger(__name__)

DEAD = MetricCounter(
    "flotilla_jetstream_dead_letters", "Requests moved to the dead-letter stream.", ["model"]
)
QUEUE_GROUP = "flotilla-dead-letters"  # each announcement is handled by one worker


class DeadLetters(Lifecycle):
    def __init__(self, nc: Client, js: JetStreamContext, config: JetStreamConfig) -> None:
        self.nc = nc
        self.js = js
        self.config = config
        self._sub: Subscription | None = None

    async def start(self) -> None:
        if self._sub is None:
            subject = f"{MAX_DELIVERIES_ADVISORY}.{self.config.stream}.*"
            self._sub = await self.nc.subscribe(subject, queue=QUEUE_GROUP, cb=self._on_advisory)

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None and not self.nc.is_closed:
            await sub.unsubscribe()

    async def _on_advisory(self, advisory: Msg) -> None:
        try:
            event = json.loads(advisory.data)
            seq, deliveries = int(event["stream_seq"]), int(event["deliveries"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable max-deliveries advisory %r: %s", advisory.data[:200], exc)
            return
        try:
            await self.bury(seq, deliveries)
        except NatsError:
            log.exception("dead-lettering message %d of %s failed", seq, self.config.stream)

    async def bury(self, seq: int, deliveries: int) -> None:
        try:
            raw = await self.js.get_msg(self.config.stream, seq)
        except NotFoundError:
            return  # acked after all (a late reply), or another worker buried it
        headers = dict(raw.headers or {})
        try:
            job, reply_to = wire.decode_job(headers, raw.data or b"")
        except wire.MalformedRecord:
            job, reply_to = None, None
        model = job.model if job is not None else "unknown"
        reason = (
            f"delivered {deliveries} times (--nats-max-deliver) without an answer: every "
            "worker that took it died, stalled past --nats-ack-wait-s, or handed it back"
        )
        headers.pop(wire.MSG_ID, None)
        await self.js.publish(
            self.config.dead_subject(model),
            raw.data or b"",
            headers={**headers, wire.DEAD_REASON: reason, wire.DEAD_DELIVERIES: str(deliveries)},
        )
        await self.js.delete_msg(self.config.stream, seq)
        DEAD.labels(model).inc()
        log.warning("request %s dead-lettered: %s", job.id if job else seq, reason)
        if job is not None and reply_to:
            error = Undeliverable(
                f"no worker could finish this request: it was {reason}; it is kept in the "
                f"dead-letter stream {self.config.dead_stream}"
            )
            payload, reply_headers = wire.encode_outcome(job.id, error)
            await self.nc.publish(reply_to, payload, headers=reply_headers)
