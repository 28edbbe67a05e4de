"""Ingest continues a producer's trace: a record produced to the real broker with a
traceparent header gets an ingest span under the producer's span (same trace) for its
embedding and upsert; a record dead-lettered gets one marked as failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from bench.services.kafka.broker import KafkaBroker
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.fleet import load_fleet
from ingest.embedding import QueueEmbedder
from ingest.kafka_source import KafkaSource, dlq_topic
from ingest.pipeline import Backoff, IngestCore
from ingest.records import RecordRules
from ingest.store.qdrant import QdrantStore
from tests.gateway.conftest import hub_offline
from tests.ingest.kafka_helpers import create_topic, produce, until
from tests.kafka.fixtures import unique_name
from tests.tracing.spans import recorded

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
GOOD_PARENT, BAD_PARENT = "00f067aa0ba902b7", "00f067aa0ba902b8"


def traceparent(span_id: str) -> bytes:
    return f"00-{TRACE_ID}-{span_id}-01".encode()


async def test_a_produced_records_context_continues_into_its_ingest_span(
    kafka_broker: KafkaBroker, tiny_fleet: Path
) -> None:
    bootstrap, topic = kafka_broker.bootstrap, unique_name("traced")
    await create_topic(bootstrap, topic, 1)
    await create_topic(bootstrap, dlq_topic(topic), 1)
    fleet = load_fleet(tiny_fleet)
    queue = InProcessQueue()
    store = QdrantStore(location=":memory:")
    rules = RecordRules("docs", "tiny", 10_000, lambda n: n if n in fleet.models else None)
    core = IngestCore(QueueEmbedder(queue), store, rules, backoff=Backoff(first_s=0.05))
    source = KafkaSource(core, bootstrap=bootstrap, topic=topic, group=unique_name("g"))
    host = ModelHost(fleet, queue, options=[RequestLimits()], device="cpu", threads=1)
    with hub_offline(), recorded() as exporter:
        async with host:
            await host.wait_ready()
            await produce(
                bootstrap, topic, [(b"doc-1", json.dumps({"text": "a traced document"}).encode())],
                headers=[("traceparent", traceparent(GOOD_PARENT))],
            )  # fmt: skip
            await produce(
                bootstrap, topic, [(b"doc-2", b'{"text": "no end')],
                headers=[("traceparent", traceparent(BAD_PARENT))],
            )  # fmt: skip
            await source.start()
            try:

                async def both_ended() -> bool:
                    return len(ingest_spans(exporter.get_finished_spans())) == 2

                await until(both_ended, 60, "the two records' ingest spans")
            finally:
                await source.stop()
    good, bad = sorted(ingest_spans(exporter.get_finished_spans()), key=offset)
    for span, parent in ((good, GOOD_PARENT), (bad, BAD_PARENT)):
        assert span.kind == SpanKind.CONSUMER
        assert f"{span.context.trace_id:032x}" == TRACE_ID  # the producer's trace
        assert span.parent is not None and f"{span.parent.span_id:016x}" == parent
        assert span.attributes is not None
        assert span.attributes["messaging.destination.name"] == topic
    assert good.status.status_code == StatusCode.UNSET
    assert bad.status.status_code == StatusCode.ERROR and bad.status.description
    assert await store.count("docs") == 1  # the good one was written while its span ran
    await store.close()


def ingest_spans(spans: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    return [span for span in spans if span.name == "flotilla.ingest.record"]


def offset(span: ReadableSpan) -> int:
    assert span.attributes is not None
    value = span.attributes["messaging.kafka.offset"]
    assert isinstance(value, int)
    return value
