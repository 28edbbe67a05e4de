"""`flotilla ingest`: a Kafka consumer, a backfill from a file, or a file sent to the
topic.

The first two run the local stack (``flotilla.wiring``): the model host, the
in-process queue and the same IngestCore that `flotilla serve` runs beside the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from aiokafka import AIOKafkaProducer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from flotilla import wiring
from flotilla.logs import quiet_repeats
from flotilla.settings import Settings
from flotilla.signals import stop_event
from ingest.kafka_source import TopicMissing
from ingest.pipeline import IngestCore, RawRecord
from ingest.records import SourceRef
from ingest.supervisor import IngestSupervisor


async def consume(settings: Settings) -> None:
    """Consume --topic until SIGINT/SIGTERM, then drain the chunk in flight and commit. A
    failed run (the broker gone for longer than the client waits, say) is restarted with
    backoff; a missing topic ends the command with what to do."""
    if not (settings.kafka and settings.topic):
        raise SystemExit("ingesting from Kafka needs --kafka BOOTSTRAP and --topic TOPIC")
    stop = stop_event()  # before loading: a stop while loading must not kill the process
    quiet_repeats()  # a broker outage is a few lines on stderr, not ten a second
    with contextlib.suppress(wiring.Stopped):
        async with wiring.running_stack(settings, stop) as stack:
            try:
                await _consume(settings, stack.core, stop)
            except TopicMissing as exc:
                raise SystemExit(exc.message) from None


async def _consume(settings: Settings, core: IngestCore, stop: asyncio.Event) -> None:
    source = wiring.kafka_source(settings, core)
    async with IngestSupervisor(source, fatal=(TopicMissing,)) as supervisor:
        running = asyncio.ensure_future(supervisor.wait())
        with progress_bar() as bar:
            task = bar.add_task(f"{settings.topic} -> {settings.collection}", lag="")
            while not (running.done() or stop.is_set()):
                await asyncio.wait({running}, timeout=1.0)
                totals = source.totals
                bar.update(
                    task,
                    completed=totals.upserted + totals.deleted + totals.dead_lettered,
                    lag=f"lag {sum(source.lag.values())}",
                )
        if running.done():
            running.result()  # re-raise what stopped the source
        running.cancel()


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


def _count(path: Path) -> int | None:
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


async def backfill(settings: Settings, path: Path) -> None:
    """Embed a file's documents straight into the store; poison lines go to
    ``<file>.dlq.jsonl`` with their reason."""
    dlq_path = path.with_name(path.name + ".dlq.jsonl")
    dead = 0

    async def dead_letter(poisons: Sequence[tuple[RawRecord, str]]) -> None:
        nonlocal dead
        # errors="replace": a reason quoting undecodable input still writes its line.
        with dlq_path.open("a", encoding="utf-8", errors="replace") as out:
            for record, reason in poisons:
                value = (record.value or b"").decode("utf-8", errors="replace")
                entry = {"line": record.source.offset, "reason": reason, "value": value}
                out.write(json.dumps(entry, ensure_ascii=False) + "\n")
        dead += len(poisons)

    async with wiring.running_stack(settings) as stack:
        with progress_bar() as bar:
            task = bar.add_task(f"{path.name} -> {settings.collection}", total=_count(path), lag="")
            for chunk in _chunks(read_records(path), settings.ingest_max_records):
                await stack.core.process(chunk, dead_letter)
                bar.advance(task, len(chunk))
    if dead:
        print(f"{dead} documents could not be ingested; see {dlq_path}")


async def produce(settings: Settings, path: Path) -> None:
    """Send a file's documents to --topic, keyed by their id, for the pipeline to ingest."""
    if not (settings.kafka and settings.topic):
        raise SystemExit("--produce needs --kafka BOOTSTRAP and --topic TOPIC")
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka, enable_idempotence=True, acks="all", linger_ms=5
    )
    await producer.start()
    try:
        with progress_bar() as bar:
            task = bar.add_task(f"{path.name} -> {settings.topic}", total=_count(path), lag="")
            for chunk in _chunks(read_records(path), 1000):
                sends = []
                for record in chunk:
                    sends.append(
                        await producer.send(settings.topic, value=record.value, key=_key(record))
                    )
                await asyncio.gather(*sends)
                bar.advance(task, len(chunk))
    finally:
        await producer.stop()


def _key(record: RawRecord) -> bytes | None:
    """The document id as the record key, so a document always lands in one partition."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        doc_id = json.loads(record.value or b"").get("id")
        if doc_id is not None:
            return str(doc_id).encode()
    return None


class RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{task.speed or 0:,.0f} docs/s")


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[lag]}"),
    )
