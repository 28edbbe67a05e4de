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

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.errors import (
    KafkaError,
    MessageSizeTooLargeError,
)
from prometheus_client import Counter as MetricCounter

from embedder.errors import (
    DeadlineExceeded,
    FlotillaError,
    InferenceFailed,
    LimitExceeded,
    NotReady,
)
from embedder.jobs import EmbedJob, JobResult
from embedder.lifecycle import Lifecycle, cancel_and_wait, watch
from embedder.queue.kafka import wire
from embedder.queue.kafka.topics import FETCH_MAX_WAIT_MS, TopicSpec, ensure_topics, short_lived

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
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        limits = short_lived(self.max_message_bytes)
        await ensure_topics(
            self.bootstrap,
            {
                self.request_topic: TopicSpec(self.request_partitions, limits),
                self.reply_topic: TopicSpec(1, limits),
            },
        )
        # Clients are made here, not in __init__: aiokafka binds them to the running loop.
        # acks=1 and no idempotence: a request lost in a leader failover ends in a 504 the
        # client retries, and a duplicate only costs a forward pass (the reply is deduped).
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks=1,
            linger_ms=0,
            max_request_size=self.max_message_bytes,
        )
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,  # this gateway alone reads its reply topic
            enable_auto_commit=False,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            max_partition_fetch_bytes=self.max_message_bytes,
        )
        await self._producer.start()
        await self._consumer.start()
        partition = TopicPartition(self.reply_topic, 0)
        self._consumer.assign([partition])
        await self._consumer.seek_to_end(partition)
        # Resolve the position now: a reply written before it would be skipped.
        await self._consumer.position(partition)
        self._task = watch(asyncio.create_task(self._read_replies(), name="kafka-replies"))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)
        for future, _ in list(self._waiters.values()):
            if not future.done():
                future.set_exception(NotReady("the gateway is shutting down"))
        assert self._consumer is not None and self._producer is not None
        await self._consumer.stop()
        await self._producer.stop()

    async def put(self, job: EmbedJob) -> asyncio.Future[JobResult]:
        if self._producer is None or self._task is None:
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

    async def _read_replies(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=1_000)
            except KafkaError:
                # Requests keep their deadlines meanwhile: none hangs past it.
                log.exception("reading replies from %s failed; retrying", self.reply_topic)
                await asyncio.sleep(1.0)
                continue
            for records in batches.values():
                for record in records:
                    self._resolve(record)

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
        if isinstance(outcome, FlotillaError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        REPLIES.labels("delivered").inc()
