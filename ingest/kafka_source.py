"""Kafka as an ingest source: a consumer group with manual commits.

Loop: fetch a chunk (up to ``max_records``) -> ``IngestCore.process`` (embed,
dead-letter, write) -> commit the chunk's offsets. Offsets are committed only
after the store and the dead-letter topic confirmed, so a crash anywhere
before the commit redelivers the chunk; deterministic point ids make the
replay harmless. While the store is down the core retries with backoff and
nothing is fetched or committed. On a rebalance the revoked partitions'
chunk finishes and commits before they move on, so two members never write
the same partition at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError
from prometheus_client import Counter, Gauge

from embedder.errors import FlotillaError
from embedder.lifecycle import Lifecycle
from ingest.pipeline import ChunkReport, IngestCore, RawRecord
from ingest.records import SourceRef

log = logging.getLogger(__name__)

LAG = Gauge(
    "flotilla_ingest_lag", "Records behind the end of each partition.", ["topic", "partition"]
)
RECORDS = Counter("flotilla_ingest_records", "Ingested records by outcome.", ["topic", "outcome"])

ERROR_HEADER = "flotilla-error"


class TopicMissing(FlotillaError):
    """The source topic does not exist. Ingestion never creates it: its partition count
    bounds how many workers can share the stream, a choice for whoever owns it."""

    http_status = 404
    code = "topic_missing"


def dlq_topic(topic: str) -> str:
    return f"{topic}.dlq"


class _DrainOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, busy: asyncio.Lock) -> None:
        self.busy = busy

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        async with self.busy:  # the chunk in flight finishes and commits first
            pass

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        log.info("assigned %s", sorted((tp.topic, tp.partition) for tp in assigned))


class KafkaSource(Lifecycle):
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
    ) -> None:
        self.core = core
        self.topic = topic
        self.max_records = max_records
        self.poll_timeout_ms = poll_timeout_ms
        self._busy = asyncio.Lock()
        self.bootstrap = bootstrap
        self.group = group
        self.max_poll_interval_ms = max_poll_interval_ms
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.totals = ChunkReport()
        self.lag: dict[int, int] = {}  # partition -> records behind its end

    async def start(self) -> None:
        if self._task is not None:
            return
        await self._check_topic()
        # Clients are made here, not in __init__: aiokafka binds them to the running loop.
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.max_records,
            # A store outage holds a chunk (with backoff) for up to this long before the
            # member is considered dead and its partitions move.
            max_poll_interval_ms=self.max_poll_interval_ms,
        )
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, enable_idempotence=True, acks="all"
        )
        await self.producer.start()
        try:
            self.consumer.subscribe([self.topic], listener=_DrainOnRevoke(self._busy))
            await self.consumer.start()
        except BaseException:
            await self.consumer.stop()
            await self.producer.stop()
            raise
        self._task = asyncio.create_task(self._run(), name=f"ingest-{self.topic}")

    async def _check_topic(self) -> None:
        """Fail fast and clearly; a consumer would wait on metadata and then raise."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            topics = set(await admin.list_topics())
        finally:
            await admin.close()
        if self.topic not in topics:
            raise TopicMissing(
                f"topic {self.topic!r} does not exist on {self.bootstrap}; create it with as "
                "many partitions as ingest workers you want to run (kafka-topics.sh --create)"
            )

    async def stop(self) -> None:
        """Finish and commit the chunk in flight, then leave the group."""
        if self._task is None:
            return
        self._stopping.set()
        task, self._task = self._task, None
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self.consumer.stop()
        await self.producer.stop()

    async def wait(self) -> None:
        """Until the source stops; re-raises what stopped it."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        while not self._stopping.is_set():
            fetched = await self.consumer.getmany(
                timeout_ms=self.poll_timeout_ms, max_records=self.max_records
            )
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
        offsets = {tp: messages[-1].offset + 1 for tp, messages in fetched.items()}
        try:
            await self.consumer.commit(offsets)
        except CommitFailedError:
            # The group moved these partitions on; their next owner replays the chunk,
            # which rewrites the same points.
            log.warning("commit of %s refused after a rebalance", offsets)
        self._account(report)

    def _account(self, report: ChunkReport) -> None:
        totals = self.totals
        totals.upserted += report.upserted
        totals.deleted += report.deleted
        totals.dead_lettered += report.dead_lettered
        RECORDS.labels(self.topic, "upserted").inc(report.upserted)
        RECORDS.labels(self.topic, "deleted").inc(report.deleted)
        RECORDS.labels(self.topic, "dead_lettered").inc(report.dead_lettered)

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
        """Send each poison record, original bytes and headers plus the reason and its
        source, to ``<topic>.dlq``; returns once the broker acknowledged them all."""
        sends = []
        for record, reason in poisons:
            headers = [
                *record.headers,
                (ERROR_HEADER, reason.encode("utf-8")),
                ("flotilla-source-topic", record.source.topic.encode()),
                ("flotilla-source-partition", str(record.source.partition).encode()),
                ("flotilla-source-offset", str(record.source.offset).encode()),
            ]
            sends.append(
                await self.producer.send(
                    dlq_topic(record.source.topic),
                    value=record.value,
                    key=record.key,
                    headers=headers,
                )
            )
        await asyncio.gather(*sends)
