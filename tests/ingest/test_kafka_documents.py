"""Scanned documents through Kafka into the store, on the real broker, the real pipeline
(`flotilla ingest`'s stack), the real PP-OCRv5 model and the real all-MiniLM-L6-v2: a
search for a sentence on page 3 finds that page, a redelivery rewrites the same points,
a tombstone removes every page, and poison documents go to the dead-letter topic while
the records around them are stored."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from flotilla import wiring
from flotilla.settings import Settings
from gateway.app import create_app
from ingest.kafka_source import ERROR_HEADER, KafkaSource, dlq_topic
from ingest.pipeline import RawRecord
from ingest.records import SourceRef
from ingest.store import chunk_point_id
from ingest.store.qdrant import QdrantStore
from tests.embedder.tasks.ocr.samples import broken_xref_pdf, image_pdf, png_bytes, render_lines
from tests.embedder.tasks.ocr.test_documents import huge_png_header
from tests.gateway.conftest import hub_offline
from tests.ingest.kafka_helpers import committed_lag, create_topic, produce, read_all, until
from tests.kafka.broker import KafkaBroker
from tests.kafka.fixtures import unique_name

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("clean_env")]

COLLECTION = "scans"
EMBEDDER, READER = "all-minilm-l6-v2", "ppocrv5-mobile"

MANUAL = [  # three pages of one scanned document, a few lines each
    ["Operating manual for the harbour crane", "Read every page before first use."],
    ["The crane lifts at most twelve tonnes.", "Never lift people with the hook."],
    ["Grease the slewing ring every month.", "Replace the steel cable after five years."],
]
RECIPES = [
    ["Grandmother's recipes", "Plum cake with a crumble topping"],
    ["Bake the bread for forty minutes.", "Let the dough rest overnight."],
    ["Serve the soup with fresh parsley.", "Keep the pickles in a cool cellar."],
]


def scanned_pdf(pages: list[list[str]]) -> bytes:
    return image_pdf([render_lines(lines, width=900) for lines in pages])


def pdf_value(doc_id: str, data: bytes, **fields: Any) -> bytes:
    url = "data:application/pdf;base64," + base64.b64encode(data).decode()
    document = {"type": "document_url", "document_url": url}
    return json.dumps({"id": doc_id, "document": document, **fields}).encode()


def image_value(doc_id: str, data: bytes) -> bytes:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return json.dumps({"id": doc_id, "document": {"type": "image_url", "image_url": url}}).encode()


def path_value(doc_id: str, path: Path) -> bytes:
    document = {"type": "document_url", "document_url": str(path)}
    return json.dumps({"id": doc_id, "document": document}).encode()


@contextlib.asynccontextmanager
async def ingesting(
    bootstrap: str, topic: str, roots: Path
) -> AsyncIterator[tuple[wiring.LocalStack, KafkaSource]]:
    """`flotilla ingest --kafka --topic`'s stack (its two models), into an in-memory store."""
    settings = Settings(
        kafka=bootstrap,
        topic=topic,
        group=unique_name("g"),
        collection=COLLECTION,
        ocr_local_roots=[roots],
    )
    assert wiring.ingest_models(settings) == [EMBEDDER, READER]
    store = QdrantStore(location=":memory:")
    with hub_offline():
        models = wiring.ingest_models(settings)
        async with wiring.running_stack(settings, store=store, models=models) as stack:
            source = wiring.kafka_source(settings, stack.core)
            async with source:
                yield stack, source


async def drained(bootstrap: str, source: KafkaSource, partitions: int) -> None:
    async def done() -> bool:
        return await committed_lag(bootstrap, source.topic, source.group, partitions) == 0

    await until(done, 120, "every record to be committed")


async def search(stack: wiring.LocalStack, query: str, **filters: Any) -> list[dict[str, Any]]:
    """The collection search route, as a client calls it."""
    app = create_app(
        wiring.gateway_config(Settings()), stack.fleet, stack.queue, stack.host, store=stack.store
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://flotilla") as client:
        body: dict[str, Any] = {"query": query, "limit": 3}
        if filters:
            body["filter"] = filters
        answer = await client.post(f"/v1/collections/{COLLECTION}/search", json=body)
    assert answer.status_code == 200, answer.text
    results: list[dict[str, Any]] = answer.json()["results"]
    return results


async def test_a_sentence_on_page_three_finds_page_three(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = unique_name("scans")
    await create_topic(bootstrap, topic, 2)
    records: list[tuple[bytes | None, bytes | None]] = [
        (b"manual", pdf_value("manual", scanned_pdf(MANUAL), metadata={"shelf": "B2"})),
        (b"recipes", pdf_value("recipes", scanned_pdf(RECIPES))),
        (b"note", b'{"text": "The crane was painted yellow in spring."}'),
    ]
    await produce(bootstrap, topic, records)
    async with ingesting(bootstrap, topic, tmp_path) as (stack, source):
        await drained(bootstrap, source, 2)
        assert (source.totals.upserted, source.totals.dead_lettered) == (3, 0)
        assert await stack.store.count(COLLECTION) == 7  # one passage a page, and the note

        [best, *_] = await search(stack, "Replace the steel cable after five years.")
        payload = best["payload"]
        assert (payload["doc_id"], payload["page"]) == ("manual", 2)  # the third page
        # The page's text as OCR read it: its lines, rows apart (the layout may set the
        # rows as blocks of their own, a blank line apart).
        assert payload["text"].split("\n") in (MANUAL[2], [MANUAL[2][0], "", MANUAL[2][1]])
        assert (payload["line_start"], payload["line_end"]) == (0, 2)
        x0, y0, x1, y1 = payload["bbox"]
        assert 0 <= x0 < x1 and 0 <= y0 < y1
        assert payload["metadata"] == {"shelf": "B2"}
        assert (payload["chunk_index"], payload["chunk_count"]) == (2, 3)
        [cake] = await search(stack, "plum cake recipe", doc_id="recipes", page=0)
        assert "Plum cake" in cake["payload"]["text"]

        # A redelivery (a crash before the commit) rewrites the same points.
        ids = [chunk_point_id(COLLECTION, "manual", i) for i in range(3)]
        before = await stack.store.retrieve(COLLECTION, ids)
        again = [
            RawRecord(key, value, (), SourceRef(topic, 0, offset))
            for offset, (key, value) in enumerate(records)
        ]
        report = await stack.core.process(again, _no_dead_letters)
        assert report.upserted == 3
        assert await stack.store.count(COLLECTION) == 7
        after = await stack.store.retrieve(COLLECTION, ids)
        assert [p.payload["page"] for p in after] == [0, 1, 2]
        assert [p.payload["text"] for p in after] == [p.payload["text"] for p in before]

        # A tombstone removes every page of its document.
        await produce(bootstrap, topic, [(b"manual", None)])
        await drained(bootstrap, source, 2)
        assert await stack.store.count(COLLECTION) == 4
        left = await search(stack, "Replace the steel cable after five years.")
        assert "manual" not in {hit["payload"]["doc_id"] for hit in left}


async def _no_dead_letters(poisons: object) -> None:
    raise AssertionError(f"nothing should be dead-lettered: {poisons}")


async def test_poison_documents_reach_the_dead_letter_topic_and_their_neighbours_are_stored(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = unique_name("poison-scans")
    await create_topic(bootstrap, topic, 1)
    page = png_bytes(render_lines(["Opening hours are nine to five."], width=700))
    (tmp_path / "notice.png").write_bytes(page)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.png"
    outside.write_bytes(page)
    records: list[tuple[bytes | None, bytes | None]] = [
        (b"before", b'{"text": "A plain document before the poison."}'),
        (b"truncated", image_value("truncated", page[:300])),
        (b"image", image_value("image", page)),
        (b"zero-bytes", image_value("zero-bytes", b"")),
        (b"huge", image_value("huge", huge_png_header(20_000, 20_000))),
        (b"broken-xref", pdf_value("broken-xref", broken_xref_pdf())),
        (b"on-disk", path_value("on-disk", tmp_path / "notice.png")),
        (b"outside", path_value("outside", outside)),
        (b"after", b'{"text": "A plain document after the poison."}'),
    ]
    await produce(bootstrap, topic, records)
    async with ingesting(bootstrap, topic, tmp_path) as (stack, source):
        await drained(bootstrap, source, 1)
        dead = await read_all(bootstrap, dlq_topic(topic), expected=5)
        totals = source.totals
        stored = await stack.store.retrieve(
            COLLECTION,
            [chunk_point_id(COLLECTION, d, 0) for d in ("before", "image", "on-disk", "after")],
        )
    reasons = {m.key: dict(m.headers)[ERROR_HEADER].decode() for m in dead}  # type: ignore[attr-defined]
    assert set(reasons) == {b"truncated", b"zero-bytes", b"huge", b"broken-xref", b"outside"}
    assert "truncated or corrupt" in reasons[b"truncated"]
    assert "empty (0 bytes)" in reasons[b"zero-bytes"]
    assert "20000x20000" in reasons[b"huge"] and "--ocr-max-pixels" in reasons[b"huge"]
    assert "the PDF cannot be opened" in reasons[b"broken-xref"]
    assert "outside the local roots" in reasons[b"outside"]
    for message in dead:
        assert message.value == dict(records)[message.key]  # type: ignore[attr-defined]
    assert totals.reasons == {"document_unreadable": 4, "document_too_large": 1}
    assert [p.payload["doc_id"] for p in stored] == ["before", "image", "on-disk", "after"]
    texts = {p.payload["doc_id"]: p.payload["text"] for p in stored}
    assert texts["image"] == texts["on-disk"] == "Opening hours are nine to five."
