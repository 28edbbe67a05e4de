"""Ingest records that name ``model: "base:adapter"``: resolved through the adapter
catalog as `flotilla ingest` wires it, embedded with that adapter, refused (dead letter)
when the adapter is unknown."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from embedder.core.adapters import AdapterCatalog
from embedder.tasks.embed.codecs import RequestLimits
from embedder.core.fleet import Fleet
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from flotilla.settings import Settings
from flotilla.wiring import record_rules
from ingest.embedding import QueueEmbedder
from ingest.pipeline import IngestCore, RawRecord
from ingest.records import SourceRef
from ingest.store import point_id
from ingest.store.qdrant import QdrantStore
from tests.fakes import FakeLoader, fake_fleet


def legal_adapter(folder: Path) -> Path:
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    return folder


async def test_records_naming_an_adapter_are_embedded_with_it(tmp_path: Path) -> None:
    raw = fake_fleet("mini", max_tokens=16).model_dump(mode="json")
    raw["models"]["mini"]["adapters"] = {"legal": str(legal_adapter(tmp_path / "legal"))}
    fleet = Fleet.model_validate(raw)
    catalog = AdapterCatalog(fleet)
    queue = InProcessQueue()
    loader = FakeLoader()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", loader=loader, adapters=catalog)
    store = QdrantStore(location=":memory:")
    rules = record_rules(Settings(collection="laws"), fleet, catalog)
    core = IngestCore(QueueEmbedder(queue), store, rules)
    dead: list[str] = []

    async def dead_letter(poisons: Sequence[tuple[RawRecord, str]]) -> None:
        dead.extend(reason for _, reason in poisons)

    docs = {"a": "Kündigung des Mietverhältnisses", "b": "Haftung des Herstellers"}
    records = [
        RawRecord(k.encode(), json.dumps({"text": t, "model": "mini:legal"}).encode(), (),
                  SourceRef("docs", 0, i))
        for i, (k, t) in enumerate(docs.items())
    ]  # fmt: skip
    records.append(
        RawRecord(b"c", json.dumps({"text": "x", "model": "mini:nope", "collection": "other"})
                  .encode(), (), SourceRef("docs", 0, 2))
    )  # fmt: skip
    async with host:
        await host.wait_ready()
        report = await core.process(records, dead_letter)
    assert (report.upserted, report.dead_lettered) == (2, 1)
    assert dead == ["unknown model 'mini:nope'"]
    runtime = loader.runtimes["mini"]
    points = await store.retrieve("laws", [point_id("laws", k) for k in docs])
    for point in points:
        text = docs[point.payload["doc_id"]]
        want = runtime.expected_vector(text, adapter="legal")
        np.testing.assert_allclose(point.vector, want, atol=1e-5)
    assert (await store.describe("laws")).model == "mini:legal"  # searches embed with it too
    await store.close()
