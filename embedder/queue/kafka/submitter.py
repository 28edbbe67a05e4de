"""The gateway's half of the work queue over Kafka (the whole is described in
``embedder.queue.kafka``): produce each job, and resolve its future from this gateway's
own reply topic."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable

from aiokafka import AIOKafkaProducer, ConsumerRecord
from aiokafka.errors import (
    KafkaError,
    MessageSizeTooLargeError,
)
from prometheus_client import Counter as MetricCounter

from embedder.errors import (
    DeadlineExceeded,
    InferenceFailed,
    LimitExceeded,
    NotReady,
)
from embedder.jobs import EmbedJob, JobResult
from embedder.lifecycle import Lifecycle
from embedder.queue.kafka import topics, wire
from embedder.queue.kafka.reader import TopicReader
from embedder.queue.protocol import resolve

log = logging.getLogger(__name__)

REPLIES = MetricCounter(
    "flotilla_kafka_replies",
    "Replies read by this gateway: 'delivered' to a waiting request, or 'dropped' "
    "(a duplicate after a redelivery, or its request already gave up).",
    ["outcome"],
)


class KafkaSubmitter(Lifecycle):
    """``put`` produces the job and returns a future; a reader of this gateway's own
    single-partition reply topic resolves it."""

    def __init__(
        self,
        *,
        bootstrap: str,
        request_topic: str,
        reply_topic: str,
        request_partitions: int = 12,
        max_message_bytes: int = 16 * 1024 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bootstrap = bootstrap
        self.request_topic = request_topic
        self.reply_topic = reply_topic
        self.request_partitions = request_partitions
        self.max_message_bytes = max_message_bytes
        self.clock = clock
        self.dropped_replies = 0
        self._waiters: dict[str, tuple[asyncio.Future[JobResult], str]] = {}
        self._producer: AIOKafkaProducer | None = None
        self._replies: TopicReader | None = None  # set once started

    async def start(self) -> None:
        if self._replies is not None:
            return
        limits = topics.short_lived(self.max_message_bytes)
        await topics.ensure_topics(
            self.bootstrap,
            {
                self.request_topic: topics.TopicSpec(self.request_partitions, limits),
                self.reply_topic: topics.TopicSpec(1, limits),
            },
        )
        self._producer = topics.producer(self.bootstrap, self.max_message_bytes)
        await self._producer.start()
        # This gateway alone reads its reply topic, from its end: older replies are for
        # requests of a gateway that has gone.
        replies = TopicReader(
            bootstrap=self.bootstrap,
            topic=self.reply_topic,
            handle=self._resolve,
            what="replies",
            fetch_max_wait_ms=topics.FETCH_MAX_WAIT_MS,
            max_partition_fetch_bytes=self.max_message_bytes,
        )
        await replies.start()
        self._replies = replies

    async def stop(self) -> None:
        replies, self._replies = self._replies, None
        if replies is None:
            return
        # The waiters fail first, so requests hear of the shutdown while the consumer
        # closes; the reader's task gets no turn in between to resolve one of them.
        for future, _ in list(self._waiters.values()):
            if not future.done():
                future.set_exception(NotReady("the gateway is shutting down"))
        await replies.stop()
        assert self._producer is not None
        await self._producer.stop()

    async def put(self, job: EmbedJob) -> asyncio.Future[JobResult]:
        if self._producer is None or self._replies is None:
            raise NotReady("the Kafka work queue is not started")
        if job.id in self._waiters:
            raise ValueError(f"job id {job.id!r} is already queued")
        future: asyncio.Future[JobResult] = asyncio.get_running_loop().create_future()
        self._waiters[job.id] = (future, job.model)
        future.add_done_callback(functools.partial(self._forget, job.id))
        try:
            # Waiting for metadata or buffer room counts against the request's deadline.
            async with asyncio.timeout(max(0.0, job.deadline - self.clock())):
                delivery = await self._producer.send(
                    self.request_topic,
                    value=job.body,
                    headers=wire.encode_job(job, self.reply_topic),
                )
        except TimeoutError:
            future.cancel()
            raise DeadlineExceeded(
                "the work queue (Kafka) did not take the request in time"
            ) from None
        except MessageSizeTooLargeError:
            future.cancel()
            raise LimitExceeded(
                f"the request is over {self.max_message_bytes} bytes, the largest Kafka record "
                "flotilla sends: split it, or raise --kafka-max-message-bytes"
            ) from None
        except KafkaError as exc:
            future.cancel()
            raise NotReady(f"the work queue (Kafka) refused the request: {exc!r}") from exc
        delivery.add_done_callback(functools.partial(self._sent, future))
        return future

    @staticmethod
    def _sent(future: asyncio.Future[JobResult], delivery: asyncio.Future[object]) -> None:
        error = delivery.exception() if not delivery.cancelled() else asyncio.CancelledError()
        if error is not None and not future.done():
            future.set_exception(NotReady(f"the work queue (Kafka) lost the request: {error!r}"))

    def _forget(self, job_id: str, future: asyncio.Future[JobResult]) -> None:
        entry = self._waiters.get(job_id)
        if entry is not None and entry[0] is future:
            del self._waiters[job_id]

    def depth(self) -> Counter[str]:
        """This gateway's jobs without a reply yet, per model (queued or running: a
        gateway cannot tell which)."""
        return Counter(model for _, model in self._waiters.values())

    def _resolve(self, record: ConsumerRecord[bytes, bytes]) -> None:
        headers = list(record.headers)
        entry = self._waiters.pop(wire.reply_id(headers) or "", None)
        if entry is None or entry[0].done():
            self.dropped_replies += 1
            REPLIES.labels("dropped").inc()
            return
        future = entry[0]
        try:
            outcome = wire.decode_outcome(headers, record.value)
        except wire.MalformedRecord as exc:
            outcome = InferenceFailed(f"the worker's reply could not be read: {exc}")
        resolve(future, outcome)
        REPLIES.labels("delivered").inc()
