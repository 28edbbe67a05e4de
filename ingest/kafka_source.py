"""Kafka as an ingest source: a consumer group with manual commits.

Loop: fetch a chunk (up to ``max_records``) -> ``IngestCore.process`` (embed,
dead-letter, write) -> commit the chunk's offsets. Offsets are committed only
after the store and the dead-letter topic confirmed, so a crash anywhere
before the commit redelivers the chunk; deterministic point ids make the
replay harmless. While the store is down the core retries with backoff and
nothing is fetched or committed. On a rebalance the revoked partitions'
chunk finishes and commits before they move on, so two members never write
the same partition at once.

Poison never stops a partition: the core dead-letters every record it cannot
process, and a batch the client itself cannot decode (a header key that is not
UTF-8) is read raw (``ingest.raw_batches``), its bad records dead-lettered and
the rest stored. The dead-letter topic ``<topic>.dlq`` (``ingest.dead_letters``) is
created at start when missing, unless ``dlq_create`` is off: then start fails at once,
saying how.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from aiokafka import ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, CorruptRecordException
from prometheus_client import Counter, Gauge

from embedder.core.errors import FlotillaError
from embedder.core.lifecycle import Lifecycle
from ingest.dead_letters import ERROR_HEADER as ERROR_HEADER
from ingest.dead_letters import dlq_topic as dlq_topic
from ingest.dead_letters import send_dead_letters
from ingest.kafka_clients import KafkaClients
from ingest.kafka_security import KafkaSecurity
from ingest.pipeline import ChunkReport, IngestCore, RawRecord
from ingest.raw_batches import raw_records, through_unreadable
from ingest.records import SourceRef
from ingest.topics import TopicSpec, ensure_topics

log = logging.getLogger(__name__)

LAG = Gauge(
    "flotilla_ingest_lag", "Records behind the end of each partition.", ["topic", "partition"]
)
RECORDS = Counter("flotilla_ingest_records", "Ingested records by outcome.", ["topic", "outcome"])
DEAD_LETTERS = Counter(
    "flotilla_ingest_dead_letters",
    "Records sent to the dead-letter topic, by reason (the Poison code).",
    ["topic", "reason"],
)


class TopicMissing(FlotillaError):
    """The source topic, or its dead-letter topic with creation forbidden, does not exist.
    Ingestion never creates the source topic: its partition count bounds how many workers
    can share the stream, a choice for whoever owns it."""

    http_status = 404
    code = "topic_missing"


class _DrainOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, busy: asyncio.Lock) -> None:
        self.busy = busy

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        async with self.busy:  # the chunk in flight finishes and commits first
            pass

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        log.info("assigned %s", sorted((tp.topic, tp.partition) for tp in assigned))


class KafkaSource(Lifecycle):
    """Restartable: after ``wait`` raised, ``stop`` then ``start`` joins the group again
    with new clients and resumes from the committed offsets; ``totals`` keep counting."""

    def __init__(
        self,
        core: IngestCore,
        *,
        bootstrap: str,
        topic: str,
        group: str,
        max_records: int = 512,
        poll_timeout_ms: int = 200,
        max_poll_interval_ms: int = 600_000,
        dlq_create: bool = True,
        security: KafkaSecurity | None = None,
    ) -> None:
        self.core = core
        self.topic = topic
        self.max_records = max_records
        self.poll_timeout_ms = poll_timeout_ms
        self._busy = asyncio.Lock()
        self.bootstrap = bootstrap
        self.kafka = KafkaClients(bootstrap, security or KafkaSecurity())
        self.group = group
        self.max_poll_interval_ms = max_poll_interval_ms
        self.dlq_create = dlq_create
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.totals = ChunkReport()
        self.lag: dict[int, int] = {}  # partition -> records behind its end

    async def start(self) -> None:
        if self._task is not None:
            return
        await self._check_topics()
        # Clients are made here, not in __init__: aiokafka binds them to the running loop.
        self.consumer = self.kafka.consumer(
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.max_records,
            # A store outage holds a chunk (with backoff) for up to this long before the
            # member is considered dead and its partitions move.
            max_poll_interval_ms=self.max_poll_interval_ms,
        )
        self.producer = self.kafka.producer(enable_idempotence=True, acks="all")
        try:
            await self.kafka.start(self.producer.start())
            self.consumer.subscribe([self.topic], listener=_DrainOnRevoke(self._busy))
            await self.kafka.start(self.consumer.start())
        except BaseException:
            await self.consumer.stop()
            await self.producer.stop()
            raise
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"ingest-{self.topic}")

    async def _check_topics(self) -> None:
        """Fail fast and clearly on a missing source topic (a consumer would wait on
        metadata and then raise), and create the dead-letter topic if it is missing (a
        producer would log 'not found' for a minute and then fail the chunk)."""
        dlq = dlq_topic(self.topic)
        admin = self.kafka.admin()
        try:
            await self.kafka.start(admin.start())
            topics = set(await admin.list_topics())
            if self.topic not in topics:
                raise TopicMissing(
                    f"topic {self.topic!r} does not exist on {self.bootstrap}; create it with "
                    "as many partitions as ingest workers you want to run (kafka-topics.sh "
                    "--create)"
                )
            if dlq in topics:
                return
            how = (
                f"create it (kafka-topics.sh --bootstrap-server {self.bootstrap} --create "
                f"--topic {dlq}) or let flotilla create it (--dlq-create, "
                "FLOTILLA_DLQ_CREATE=true)"
            )
            if not self.dlq_create:
                raise TopicMissing(
                    f"the dead-letter topic {dlq!r} does not exist on {self.bootstrap} and "
                    f"--no-dlq-create forbids creating it; {how}"
                )
            (described,) = await admin.describe_topics([self.topic])
            partitions = max(1, len(described.get("partitions") or []))
        finally:
            await admin.close()
        try:
            await ensure_topics(self.kafka, {dlq: TopicSpec(partitions)})
        except FlotillaError as exc:
            raise TopicMissing(
                f"the dead-letter topic {dlq!r} could not be created ({exc.message}); {how}"
            ) from exc
        log.info("created the dead-letter topic %s with %d partitions", dlq, partitions)

    async def stop(self) -> None:
        """Finish and commit the chunk in flight, then leave the group. After a failure
        it only closes the clients: ``wait`` has raised what stopped the loop."""
        if self._task is None:
            return
        self._stopping.set()
        task, self._task = self._task, None
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        except Exception:
            log.debug("the ingest loop of %s had failed", self.topic, exc_info=True)
        finally:
            await self.consumer.stop()
            await self.producer.stop()

    async def wait(self) -> None:
        """Until the source stops; re-raises what stopped it."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                fetched = await self.consumer.getmany(
                    timeout_ms=self.poll_timeout_ms, max_records=self.max_records
                )
            except (UnicodeDecodeError, CorruptRecordException) as exc:
                # aiokafka could not decode a batch; it raises the same on every fetch.
                if not await self._read_unreadable():
                    raise
                log.debug("read around a batch the client could not decode: %s", exc)
                continue
            if fetched:
                async with self._busy:
                    await self._process(fetched)
            await self._update_lag()

    async def _process(self, fetched: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        records = [
            RawRecord(
                key=msg.key,
                value=msg.value,
                headers=tuple(msg.headers),
                source=SourceRef(tp.topic, tp.partition, msg.offset),
            )
            for tp, messages in fetched.items()
            for msg in messages
        ]
        report = await self.core.process(records, self.dead_letter)
        await self._commit({tp: messages[-1].offset + 1 for tp, messages in fetched.items()})
        self._account(report)

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        try:
            await self.consumer.commit(offsets)
        except CommitFailedError:
            # The group moved these partitions on; their next owner replays the chunk,
            # which rewrites the same points.
            log.warning("commit of %s refused after a rebalance", offsets)

    async def _read_unreadable(self) -> bool:
        """For each assigned partition whose next batches the client cannot decode: read
        them raw up to the end of the first such batch, process those records (the bad
        ones are dead-lettered), commit and move past it. False if no partition has such
        a batch (the failure was something else)."""
        handled = False
        for tp in sorted(self.consumer.assignment()):
            # The failed fetch may have consumed other partitions' records without
            # returning them: every partition goes back to its committed offset (a replay
            # at most, which rewrites the same points).
            position = await self.consumer.committed(tp)
            if position is None:
                position = (await self.consumer.beginning_offsets([tp]))[tp]
            self.consumer.seek(tp, position)
            batches = await through_unreadable(self.kafka, tp, position)
            if batches is None:
                continue
            last = batches[-1]
            try:
                records = raw_records(tp, batches, position)
            except (ValueError, IndexError, KeyError) as exc:  # not even raw: say so, fail
                log.error(
                    "partition %s: the batch at %d is unreadable: %s", tp, last.base_offset, exc
                )
                continue
            log.warning(
                "partition %s: the Kafka client cannot decode the batch at offsets %d-%d; "
                "reading it raw",
                tp,
                last.base_offset,
                last.next_offset - 1,
            )
            async with self._busy:
                for start in range(0, len(records), self.max_records):
                    chunk = records[start : start + self.max_records]
                    self._account(await self.core.process(chunk, self.dead_letter))
                await self._commit({tp: last.next_offset})
            self.consumer.seek(tp, last.next_offset)
            handled = True
        return handled

    def _account(self, report: ChunkReport) -> None:
        totals = self.totals
        totals.upserted += report.upserted
        totals.deleted += report.deleted
        totals.dead_lettered += report.dead_lettered
        RECORDS.labels(self.topic, "upserted").inc(report.upserted)
        RECORDS.labels(self.topic, "deleted").inc(report.deleted)
        RECORDS.labels(self.topic, "dead_lettered").inc(report.dead_lettered)
        for code, count in report.reasons.items():
            DEAD_LETTERS.labels(self.topic, code).inc(count)
            totals.reasons[code] = totals.reasons.get(code, 0) + count
        if report.reasons:
            log.warning(
                "dead-lettered %d records of %s to %s (%s)",
                report.dead_lettered,
                self.topic,
                dlq_topic(self.topic),
                ", ".join(f"{code}: {n}" for code, n in sorted(report.reasons.items())),
            )

    async def _update_lag(self) -> None:
        assigned = self.consumer.assignment()
        self.lag = {p: n for p, n in self.lag.items() if TopicPartition(self.topic, p) in assigned}
        for tp in assigned:
            end = self.consumer.highwater(tp)
            if end is not None:
                position = await self.consumer.position(tp)
                self.lag[tp.partition] = max(0, end - position)
                LAG.labels(tp.topic, str(tp.partition)).set(self.lag[tp.partition])

    async def dead_letter(self, poisons: Sequence[tuple[RawRecord, str]]) -> None:
        await send_dead_letters(self.producer, poisons)
