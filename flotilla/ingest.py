"""`flotilla ingest`: a Kafka consumer, a backfill from a file, or a file sent to the
topic (or to a running server: ``flotilla.documents_client``).

The first two run the local stack (``flotilla.wiring``) with the ingest model only: the
model host, the in-process queue and the same IngestCore that `flotilla serve` runs
beside the gateway. Both open the target collection before loading the model, so one
that another process owns fails at once, naming the ways in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from embedder.core.errors import LinkRefused
from flotilla import wiring
from flotilla.logs import quiet_repeats
from flotilla.progress import Progress, Tally
from flotilla.settings import Settings
from flotilla.signals import stop_event
from ingest.kafka_clients import KafkaClients
from ingest.kafka_source import TopicMissing, dlq_topic
from ingest.pipeline import IngestCore, RawRecord
from ingest.records import SourceRef
from ingest.supervisor import IngestSupervisor


async def consume(settings: Settings) -> None:
    """Consume --topic until SIGINT/SIGTERM, then drain the chunk in flight and commit. A
    failed run (the broker gone for longer than the client waits, say) is restarted with
    backoff; a missing topic, or brokers that refuse the link's security (credentials,
    TLS), end the command with what to do."""
    if not (settings.ingest.bootstrap and settings.ingest.topic):
        raise SystemExit("ingesting from Kafka needs --kafka BOOTSTRAP and --topic TOPIC")
    stop = stop_event()  # before loading: a stop while loading must not kill the process
    quiet_repeats()  # a broker outage is a few lines on stderr, not ten a second
    wiring.configure_tracing(settings, "flotilla-ingest")
    with contextlib.suppress(wiring.Stopped):
        async with wiring.running_stack(
            settings,
            stop,
            models=wiring.ingest_models(settings),
            claim=[settings.ingest.collection],
        ) as stack:
            try:
                await _consume(settings, stack.core, stop)
            except TopicMissing as exc:
                raise SystemExit(exc.message) from None


async def _consume(settings: Settings, core: IngestCore, stop: asyncio.Event) -> None:
    source = wiring.kafka_source(settings, core)

    def tally() -> Tally:
        totals = source.totals
        done = totals.upserted + totals.deleted + totals.dead_lettered
        return Tally(done, totals.upserted, totals.deleted, totals.dead_lettered)

    progress = Progress(
        f"{settings.ingest.topic} -> {settings.ingest.collection}",
        unit="records",
        interval_s=settings.progress_interval_s,
        note=lambda: f"lag {sum(source.lag.values())}",
    )
    async with progress:
        supervisor = IngestSupervisor(
            source, fatal=(TopicMissing, LinkRefused), store=core.store_watch
        )
        async with supervisor:
            running = asyncio.ensure_future(supervisor.wait())
            while not (running.done() or stop.is_set()):
                await asyncio.wait({running}, timeout=1.0)
                progress.set(tally())
            if running.done():
                running.result()  # re-raise what stopped the supervisor (a missing topic)
            running.cancel()
        progress.set(tally())  # with the chunk drained at the stop
    dead = f"; reasons in topic {dlq_topic(source.topic)}" if source.totals.dead_lettered else ""
    print(progress.summary() + dead)


def read_records(path: Path) -> Iterator[RawRecord]:
    """A backfill file as records: JSON lines, or Parquet rows (id, text, metadata?,
    collection?, model?), each the value of a record without key."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for number, row in enumerate(pq.read_table(path).to_pylist()):
            # default=str: a column JSON cannot hold (bytes, dates) still makes a record,
            # which the record contract then accepts or dead-letters with its reason.
            fields = {k: v for k, v in row.items() if v is not None}
            value = json.dumps(fields, default=str).encode()
            yield RawRecord(None, value, (), SourceRef(str(path), 0, number))
        return
    with path.open("rb") as lines:
        for number, line in enumerate(lines):
            if line.strip():
                yield RawRecord(None, line.rstrip(b"\r\n"), (), SourceRef(str(path), 0, number))


def count_records(path: Path) -> int | None:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    with path.open("rb") as lines:
        return sum(1 for line in lines if line.strip())


def _chunks(records: Iterator[RawRecord], size: int) -> Iterator[list[RawRecord]]:
    chunk: list[RawRecord] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class DeadLetterFile:
    """A file's documents that could not be ingested, each with its reason, one JSON object
    a line (``line``, ``reason``, ``value``) in ``<file>.dlq.jsonl``: the backfill's and
    the --server path's. A run starts it afresh, so it holds that run's failures."""

    def __init__(self, source: Path) -> None:
        self.path = source.with_name(source.name + ".dlq.jsonl")
        self.path.unlink(missing_ok=True)
        self.count = 0

    def write(self, entries: Sequence[tuple[RawRecord, str]]) -> None:
        # errors="replace": a reason quoting undecodable input still writes its line.
        with self.path.open("a", encoding="utf-8", errors="replace") as out:
            for record, reason in entries:
                value = (record.value or b"").decode("utf-8", errors="replace")
                entry = {"line": record.source.offset, "reason": reason, "value": value}
                out.write(json.dumps(entry, ensure_ascii=False) + "\n")
        self.count += len(entries)

    def __str__(self) -> str:
        return f"; reasons in {self.path}" if self.count else ""


async def backfill(settings: Settings, path: Path) -> None:
    """Embed a file's documents straight into the store; poison lines go to
    ``<file>.dlq.jsonl`` with their reason."""
    models = wiring.ingest_models(settings)
    async with wiring.running_stack(
        settings, models=models, claim=[settings.ingest.collection]
    ) as stack:
        dead = DeadLetterFile(path)

        async def dead_letter(poisons: Sequence[tuple[RawRecord, str]]) -> None:
            dead.write(poisons)

        progress = Progress(
            f"{path.name} -> {settings.ingest.collection}",
            count_records(path),
            interval_s=settings.progress_interval_s,
        )
        async with progress:
            for chunk in _chunks(read_records(path), settings.ingest.max_records):
                report = await stack.core.process(chunk, dead_letter)
                progress.add(
                    done=len(chunk),
                    stored=report.upserted,
                    deleted=report.deleted,
                    failed=report.dead_lettered,
                )
    print(f"{progress.summary()}{dead}")


async def produce(settings: Settings, path: Path) -> None:
    """Send a file's documents to --topic, keyed by their id, for the pipeline to ingest."""
    bootstrap, topic = settings.ingest.bootstrap, settings.ingest.topic
    if not (bootstrap and topic):
        raise SystemExit("--produce needs --kafka BOOTSTRAP and --topic TOPIC")
    kafka = KafkaClients(bootstrap, settings.kafka_security)
    producer = kafka.producer(enable_idempotence=True, acks="all", linger_ms=5)
    await kafka.start(producer.start())
    progress = Progress(
        f"{path.name} -> {topic}",
        count_records(path),
        interval_s=settings.progress_interval_s,
        outcomes=False,
    )
    try:
        async with progress:
            for chunk in _chunks(read_records(path), 1000):
                sends = []
                for record in chunk:
                    sends.append(await producer.send(topic, value=record.value, key=_key(record)))
                await asyncio.gather(*sends)
                progress.add(done=len(chunk))
    finally:
        await producer.stop()
    print(f"{progress.summary()} (acknowledged by the broker)")


def _key(record: RawRecord) -> bytes | None:
    """The document id as the record key, so a document always lands in one partition."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        doc_id = json.loads(record.value or b"").get("id")
        if doc_id is not None:
            return str(doc_id).encode()
    return None
