"""The worker's half of the work queue over Kafka (the whole is described in
``embedder.queue.kafka``): a consumer-group member that pulls up to its budget, runs,
replies, and commits only what has been answered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
    MessageSizeTooLargeError,
)
from prometheus_client import Counter as MetricCounter

from embedder.batching import take_within, urgency
from embedder.errors import LimitExceeded, NotReady
from embedder.jobs import EmbedJob
from embedder.lifecycle import Lifecycle, cancel_and_wait, watch
from embedder.queue.kafka import topics, wire
from embedder.queue.kafka.puller_state import PullerState
from embedder.queue.protocol import Outcome

log = logging.getLogger(__name__)

SKIPPED = MetricCounter(
    "flotilla_kafka_skipped_requests",
    "Request records a worker did not run: 'expired' (deadline passed), 'malformed'.",
    ["reason"],
)

# A killed worker's partitions move after the session timeout; 6 s is the broker's
# default minimum (group.min.session.timeout.ms).
SESSION_TIMEOUT_MS = 6_000
HEARTBEAT_INTERVAL_MS = 1_000
# Done offsets are committed this often: the most a crash redoes, in time.
COMMIT_INTERVAL_S = 0.1
# On a rebalance, jobs already handed to the worker get this long to finish before
# their partitions go (each rebalance pauses the whole group, so keep it short).
REVOKE_DRAIN_S = 1.0


@dataclass(slots=True, eq=False)
class _Partition:
    """One assigned partition: what was read and what is still owed a reply. Replaced by
    a fresh object on every assignment, so work from before a rebalance cannot move it."""

    outstanding: set[int] = field(default_factory=set)
    read_to: int | None = None  # offset after the last record read
    committed: int | None = None

    def commit_point(self) -> int | None:
        return min(self.outstanding) if self.outstanding else self.read_to


@dataclass(slots=True)
class _Held:
    """A job this worker has read and not yet answered."""

    reply_to: str
    tp: TopicPartition
    partition: _Partition
    offset: int


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, puller: KafkaPuller) -> None:
        self.puller = puller

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        await self.puller._revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        self.puller._assigned(assigned)


class KafkaPuller(Lifecycle):
    """A member of the workers' consumer group; the worker's ``JobPuller``.

    Only ``pull`` reads from Kafka, and only while the buffer is under the budget asked
    for, so a busy worker leaves its backlog in its partitions. Offsets are committed
    every ``COMMIT_INTERVAL_S`` up to the first job without an acknowledged reply.
    Whether it hands jobs out and sends answers follows from one ``PullerState``.
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        group: str,
        partitions: int = 12,
        max_message_bytes: int = 16 * 1024 * 1024,
        max_poll_records: int = 64,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.group = group
        self.partitions = partitions
        self.max_message_bytes = max_message_bytes
        self.max_poll_records = max_poll_records
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.clock = clock
        self.skipped_expired = 0
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._committer: asyncio.Task[None] | None = None
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._held: dict[str, _Held] = {}
        self._buffer: list[EmbedJob] = []
        self._replies: set[asyncio.Task[None]] = set()
        self._released = asyncio.Event()  # set whenever a job leaves _held
        self._state = PullerState()

    async def start(self) -> None:
        if self._consumer is not None:
            return
        spec = topics.TopicSpec(self.partitions, topics.short_lived(self.max_message_bytes))
        await topics.ensure_topics(self.bootstrap, {self.topic: spec})
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            # A new group starts at the oldest request: jobs still in their deadline run,
            # older ones are skipped unread (their headers say they expired).
            auto_offset_reset="earliest",
            fetch_max_wait_ms=topics.FETCH_MAX_WAIT_MS,
            max_partition_fetch_bytes=self.max_message_bytes,
            max_poll_records=self.max_poll_records,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
        )
        self._producer = topics.producer(self.bootstrap, self.max_message_bytes)
        await self._producer.start()
        self._consumer.subscribe([self.topic], listener=_Rebalance(self))
        await self._consumer.start()
        # Only now may pull() fetch: the worker pulls as soon as its first model loads,
        # and a consumer still starting has no coordinator yet.
        self._state = self._state.joined()
        self._committer = watch(asyncio.create_task(self._commit_loop(), name="kafka-commits"))

    async def stop(self) -> None:
        """Commit what is answered and leave the group (its partitions move at once).
        Call ``drain`` first to finish the work in hand."""
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        self._state = self._state.stopped()
        await cancel_and_wait(self._committer)
        if self._replies:
            await asyncio.wait(set(self._replies), timeout=10.0)
        await self._commit(consumer)
        self._partitions.clear()  # leaving revokes them; nothing left to commit there
        await consumer.stop()
        assert self._producer is not None
        await self._producer.stop()

    async def drain(self, timeout_s: float) -> int:
        """Stop handing out jobs and wait until the worker has answered those it has.
        Jobs read but not handed out stay uncommitted, for the next owner; so do the
        jobs still unanswered after ``timeout_s``, which are then abandoned (their
        answers are dropped). Returns how many were abandoned."""
        self._state = self._state.draining()
        self._drop_buffered(lambda held: True)
        await self._until_answered(lambda: not self._held, time.monotonic() + timeout_s)
        self._state = self._state.abandoned()
        return len(self._held)

    # -- JobPuller ---------------------------------------------------------------------

    async def pull(
        self, models: Collection[str], max_tokens: int, timeout_s: float
    ) -> list[EmbedJob]:
        # The consumer is None only in states that hand nothing out; checked for the types.
        if self._consumer is None or not self._state.hands_out:
            await asyncio.sleep(timeout_s)
            return []
        if not self._buffer:
            await self._fetch(self._consumer, timeout_s)
        elif sum(job.est_tokens for job in self._buffer) < max_tokens:
            await self._fetch(self._consumer, 0.0)  # top up with what has arrived
        if not self._state.hands_out:  # a rebalance or drain began meanwhile: buffer gone
            return []
        foreign = [job for job in self._buffer if job.model not in models]
        for job in foreign:
            # All members of one group should serve one fleet; a model that failed to load
            # here gets a clear, retriable error rather than a 504.
            await self.complete(
                job.id, NotReady(f"the worker that took this request does not serve {job.model!r}")
            )
        self._buffer = sorted((job for job in self._buffer if job.model in models), key=urgency)
        taken = take_within(self._buffer, max_tokens)
        del self._buffer[: len(taken)]
        return taken

    async def complete(self, job_id: str, outcome: Outcome) -> None:
        held = self._held.pop(job_id, None)
        if held is None or not self._state.answers:
            return
        self._released.set()
        # Sending in a task: a reply topic whose gateway is gone makes the producer wait for
        # metadata, and the worker must not wait with it.
        task = watch(
            asyncio.create_task(self._reply(held, job_id, outcome), name=f"reply-{job_id}")
        )
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    def cancelled(self, job_ids: Iterable[str]) -> set[str]:
        """Jobs this worker no longer answers for: unknown, abandoned, or read from a
        partition that has since moved (its next owner runs them)."""
        gone: set[str] = set()
        for job_id in job_ids:
            held = self._held.get(job_id)
            if held is None or not self._state.answers:
                gone.add(job_id)
            elif self._partitions.get(held.tp) is not held.partition:
                del self._held[job_id]
                gone.add(job_id)
                self._released.set()
        return gone

    def in_hand(self) -> int:
        """Jobs read and not yet answered (buffered or handed to the worker)."""
        return len(self._held)

    # -- reading -----------------------------------------------------------------------

    async def _fetch(self, consumer: AIOKafkaConsumer, timeout_s: float) -> None:
        try:
            batches = await consumer.getmany(
                timeout_ms=int(timeout_s * 1e3), max_records=self.max_poll_records
            )
        except KafkaError:
            log.exception("fetching requests from %s failed", self.topic)
            await asyncio.sleep(timeout_s)
            return
        now = self.clock()
        for tp, records in batches.items():
            partition = self._partitions.get(tp)
            if partition is None:
                continue  # revoked meanwhile: the next owner reads these again
            for record in records:
                partition.read_to = record.offset + 1
                self._admit(tp, partition, record, now)

    def _admit(
        self,
        tp: TopicPartition,
        partition: _Partition,
        record: ConsumerRecord[bytes, bytes],
        now: float,
    ) -> None:
        try:
            job, reply_to = wire.decode_job(list(record.headers), record.value)
        except wire.MalformedRecord as exc:
            log.warning("skipping request %s@%d: %s", tp, record.offset, exc)
            SKIPPED.labels("malformed").inc()
            return
        if job.deadline <= now:  # its gateway has answered 504 already
            self.skipped_expired += 1
            SKIPPED.labels("expired").inc()
            return
        held = self._held.get(job.id)
        if held is not None and self._partitions.get(held.tp) is held.partition:
            return  # the same request twice (a producer retry): it is in hand already
        partition.outstanding.add(record.offset)
        if held is not None:
            # Read again after a rebalance while the worker still has it: its answer now
            # settles this copy's offset.
            held.tp, held.partition, held.offset = tp, partition, record.offset
            return
        self._held[job.id] = _Held(reply_to, tp, partition, record.offset)
        self._buffer.append(job)

    # -- answering and committing ------------------------------------------------------

    async def _reply(self, held: _Held, job_id: str, outcome: Outcome) -> None:
        assert self._producer is not None
        value, headers = wire.encode_outcome(job_id, outcome)
        try:
            try:
                delivery = await self._producer.send(held.reply_to, value=value, headers=headers)
            except MessageSizeTooLargeError:
                error = LimitExceeded(
                    f"the response is over {self.max_message_bytes} bytes, the largest Kafka "
                    "record flotilla sends: ask for fewer inputs, or raise "
                    "--kafka-max-message-bytes"
                )
                value, headers = wire.encode_outcome(job_id, error)
                delivery = await self._producer.send(held.reply_to, value=value, headers=headers)
            await delivery
        except KafkaError as exc:
            # Not retried: its gateway is gone or the broker is failing, and the request's
            # deadline answers the client either way.
            log.warning("reply to %s for %s failed: %r", held.reply_to, job_id, exc)
        finally:
            self._settle(held)

    def _settle(self, held: _Held) -> None:
        if self._partitions.get(held.tp) is held.partition:
            held.partition.outstanding.discard(held.offset)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(COMMIT_INTERVAL_S)
            if self._consumer is not None:
                await self._commit(self._consumer)

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        due: dict[TopicPartition, tuple[_Partition, int]] = {}
        for tp, partition in self._partitions.items():
            point = partition.commit_point()
            if point is not None and (partition.committed is None or point > partition.committed):
                due[tp] = (partition, point)
        if not due:
            return
        try:
            await consumer.commit({tp: point for tp, (_, point) in due.items()})
        except (CommitFailedError, IllegalStateError) as exc:
            log.info("commit skipped, the group is rebalancing: %s", exc)
            return
        except KafkaError:
            log.exception("commit failed; retrying with the next one")
            return
        for partition, point in due.values():
            partition.committed = point

    def _drop_buffered(self, which: Callable[[_Held], bool]) -> None:
        keep: list[EmbedJob] = []
        for job in self._buffer:
            if which(self._held[job.id]):
                del self._held[job.id]
            else:
                keep.append(job)
        self._buffer = keep
        self._released.set()

    async def _until_answered(self, done: Callable[[], bool], deadline: float) -> None:
        """Wait until ``done()`` (checked each time a job leaves _held), then until the
        broker has acknowledged every reply sent, or until the deadline."""
        while not done() and (remaining := deadline - time.monotonic()) > 0:
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), remaining)
        if self._replies:  # answered, but the broker has not acknowledged every reply yet
            await asyncio.wait(set(self._replies), timeout=max(0.0, deadline - time.monotonic()))

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        self._state = self._state.revoking()
        self._drop_buffered(lambda held: held.tp in revoked)
        await self._until_answered(
            lambda: all(h.tp not in revoked for h in self._held.values()),
            time.monotonic() + REVOKE_DRAIN_S,
        )
        if self._consumer is not None:
            await self._commit(self._consumer)
        for tp in revoked:
            self._partitions.pop(tp, None)

    def _assigned(self, assigned: Sequence[TopicPartition]) -> None:
        for tp in assigned:
            self._partitions[tp] = _Partition()
        self._state = self._state.assigned()
        log.info("assigned %s", sorted(tp.partition for tp in assigned))
