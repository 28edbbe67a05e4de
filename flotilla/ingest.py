"""Wiring for `flotilla ingest`: a Kafka consumer, or a backfill from a file.

Both run the model host, the in-process queue and the same IngestCore that
`flotilla serve` runs beside the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence
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

from embedder.adapters import AdapterCatalog
from embedder.codecs import RequestLimits
from embedder.errors import ModelNotFound
from embedder.fleet import Fleet, load_fleet
from embedder.host import ModelHost
from embedder.jobs import split_model
from embedder.queue.inprocess import InProcessQueue
from flotilla.settings import Settings
from flotilla.signals import stop_event, unless_stopped
from ingest.embedding import QueueEmbedder
from ingest.errors import TopicMissing
from ingest.kafka_source import KafkaSource
from ingest.pipeline import IngestCore, RawRecord
from ingest.records import RecordRules, SourceRef
from ingest.store import VectorStore, open_store


def configured_store(settings: Settings) -> VectorStore:
    if settings.store == "qdrant":
        if not settings.qdrant_url:
            raise SystemExit("--store qdrant needs --qdrant-url (FLOTILLA_QDRANT_URL)")
        return open_store("qdrant", url=settings.qdrant_url, api_key=settings.qdrant_api_key)
    return open_store("edge", data_dir=settings.data_dir)


def adapter_catalog(settings: Settings, fleet: Fleet) -> AdapterCatalog:
    return AdapterCatalog(fleet, settings.adapters_root)


def record_rules(settings: Settings, fleet: Fleet, adapters: AdapterCatalog) -> RecordRules:
    def resolve(name: str) -> str | None:
        """A model name, alias or 'model:adapter' -> its canonical form; None if unknown."""
        base, adapter = split_model(name)
        try:
            model = fleet.get(base).name
            if adapter is None:
                return model
            adapters.find(model, adapter)
        except ModelNotFound:  # AdapterNotFound included
            return None
        return f"{model}:{adapter}"

    return RecordRules(
        default_collection=settings.collection,
        default_model=fleet.default_model,
        max_text_bytes=settings.ingest_max_text_bytes,
        resolve_model=resolve,
    )


def request_limits(settings: Settings) -> RequestLimits:
    return RequestLimits(
        max_inputs=settings.max_inputs_per_request, auto_truncate=settings.auto_truncate
    )


class Stopped(Exception):
    """A stop signal came while the models were still loading."""


@contextlib.asynccontextmanager
async def ingest_stack(
    settings: Settings, stop: asyncio.Event | None = None, *, store: VectorStore | None = None
) -> AsyncIterator[tuple[IngestCore, VectorStore]]:
    """Models loaded, a worker pulling, and a core writing to the configured store (or to
    ``store``, which it then closes). Raises Stopped if ``stop`` is set before the models
    are loaded."""
    fleet = load_fleet(settings.fleet).with_model_cache(settings.model_cache_dir)
    queue = InProcessQueue()
    adapters = adapter_catalog(settings, fleet)
    host = ModelHost(
        fleet,
        queue,
        request_limits(settings),
        device=settings.device,
        threads=settings.threads,
        adapters=adapters,
    )
    store = store or configured_store(settings)
    core = IngestCore(
        QueueEmbedder(
            queue, bytes_per_token=settings.bytes_per_token, truncate=settings.auto_truncate
        ),
        store,
        record_rules(settings, fleet, adapters),
    )
    async with host, store:
        loaded = await unless_stopped(host.wait_ready(), stop or asyncio.Event())
        if not loaded:
            raise Stopped
        if not host.loaded:
            raise SystemExit(f"no model could be loaded: {host.failed}")
        yield core, store


async def consume(settings: Settings) -> None:
    """Consume --topic until SIGINT/SIGTERM, then drain the chunk in flight and commit."""
    if not (settings.kafka and settings.topic):
        raise SystemExit("ingesting from Kafka needs --kafka BOOTSTRAP and --topic TOPIC")
    stop = stop_event()  # before loading: a stop while loading must not kill the process
    with contextlib.suppress(Stopped):
        async with ingest_stack(settings, stop) as (core, _):
            try:
                await _consume(settings, core, stop)
            except TopicMissing as exc:
                raise SystemExit(exc.message) from None


async def _consume(settings: Settings, core: IngestCore, stop: asyncio.Event) -> None:
    assert settings.kafka and settings.topic  # checked by consume()
    source = KafkaSource(
        core,
        bootstrap=settings.kafka,
        topic=settings.topic,
        group=settings.group,
        max_records=settings.ingest_max_records,
    )
    async with source:
        running = asyncio.ensure_future(source.wait())
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
            value = json.dumps({k: v for k, v in row.items() if v is not None}).encode()
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
        with dlq_path.open("a", encoding="utf-8") as out:
            for record, reason in poisons:
                value = (record.value or b"").decode("utf-8", errors="replace")
                entry = {"line": record.source.offset, "reason": reason, "value": value}
                out.write(json.dumps(entry, ensure_ascii=False) + "\n")
        dead += len(poisons)

    async with ingest_stack(settings) as (core, _):
        with progress_bar() as bar:
            task = bar.add_task(f"{path.name} -> {settings.collection}", total=_count(path), lag="")
            for chunk in _chunks(read_records(path), settings.ingest_max_records):
                await core.process(chunk, dead_letter)
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
