"""`flotilla eval retrieval` end to end on a tiny corpus: two tiny models through the
model host, the queue, the ingest core and each store, side by side with BM25."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from flotilla.evaluate import retrieval
from flotilla.settings import Settings
from ingest.store import open_store
from ingest.store.edge import EdgeStore
from lora.dataset import write_jsonl, write_qrels
from lora.evaluate import EvalError, collection_for, table
from tests.gateway.conftest import hub_offline

pytestmark = pytest.mark.slow

PASSAGES = {
    "d1": "Der Urlaub beträgt jährlich mindestens 24 Werktage.",
    "d2": "Die Kündigung des Arbeitsverhältnisses bedarf der Schriftform.",
    "d3": "Der Mieter hat die Miete zu Beginn des Monats zu entrichten.",
    "d4": "Wer einen Menschen tötet, wird mit Freiheitsstrafe bestraft.",
    "d5": "Der Anspruch verjährt in drei Jahren.",
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Path:
    folder = tmp_path_factory.mktemp("eval-fleet")
    profile = {"cpu": {"dtype": "float32", "max_batch_tokens": 4096, "max_wait_ms": 2}}
    models = {
        name: {"source": {"path": str(path)}, "max_tokens": 64, "profiles": profile}
        for name, path in tiny_models.items()
    }
    fleet_file = folder / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
    return fleet_file


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "corpus.jsonl", ({"id": k, "text": v} for k, v in PASSAGES.items()))
    # Queries that repeat a passage word for word: any encoder ranks that passage first.
    write_jsonl(
        tmp_path / "queries.jsonl",
        [
            {"id": "q1", "text": PASSAGES["d1"]},
            {"id": "q2", "text": PASSAGES["d4"]},
            {"id": "q3", "text": "not judged, so not asked"},
        ],
    )
    write_qrels(tmp_path / "qrels.tsv", {"q1": {"d1": 1}, "q2": {"d4": 1, "d5": 0}})
    return tmp_path


async def run(settings: Settings, data: Path, **kwargs: object) -> dict[str, object]:
    with hub_offline():
        return await retrieval(
            settings,
            corpus_path=data / "corpus.jsonl",
            queries_path=data / "queries.jsonl",
            qrels_path=data / "qrels.tsv",
            **kwargs,  # type: ignore[arg-type]
        )


async def test_two_models_and_bm25_through_the_edge_store(fleet: Path, data: Path) -> None:
    settings = Settings(fleet=fleet, device="cpu", data_dir=data / "store", collection="laws")
    out = data / "report.json"
    report = await run(settings, data, models=["tiny-a", "tiny-b"], out=out)

    assert report == json.loads(out.read_text())
    assert report["corpus"] == 5 and report["queries"] == 2
    systems = {s["name"]: s for s in report["systems"]}  # type: ignore[attr-defined]
    assert list(systems) == ["bm25", "tiny-a", "tiny-b"]
    for name in ("bm25", "tiny-a", "tiny-b"):
        assert systems[name]["metrics"] == {
            "ndcg@10": 1.0, "recall@10": 1.0, "recall@100": 1.0, "mrr@10": 1.0
        }  # fmt: skip
    assert systems["tiny-a"]["collection"] == "laws.tiny-a"
    async with EdgeStore(data / "store") as store:
        for name in ("tiny-a", "tiny-b"):
            spec = await store.describe(collection_for("laws", name))
            assert (spec.model, spec.dimension) == (name, 32)
            assert await store.count(spec.name) == 5


async def test_the_qdrant_client_store(fleet: Path, data: Path) -> None:
    store = open_store("qdrant", location=":memory:")
    settings = Settings(fleet=fleet, device="cpu", collection="laws")
    report = await run(settings, data, models=["tiny-b"], bm25=False, store=store)
    (system,) = report["systems"]  # type: ignore[misc]
    assert system["name"] == "tiny-b" and system["metrics"]["mrr@10"] == 1.0
    assert set(report["per_query"]["tiny-b"]) == {"q1", "q2"}  # type: ignore[index]


async def test_a_model_the_pipeline_cannot_serve_is_a_clear_error(fleet: Path, data: Path) -> None:
    settings = Settings(fleet=fleet, device="cpu", data_dir=data / "store")
    with pytest.raises(EvalError, match="tiny-a:legal"):
        await run(settings, data, models=["tiny-a:legal"], bm25=False)


def test_the_table_puts_systems_side_by_side() -> None:
    from lora.evaluate import SystemResult

    scores = {"ndcg@10": 0.5, "recall@10": 0.6, "recall@100": 0.9, "mrr@10": 0.4}
    better = {**scores, "ndcg@10": 0.75}
    text = table(
        [
            SystemResult("bm25", "bm25", scores, {}),
            SystemResult("base", "dense", scores, {}),
            SystemResult("base:legal", "dense", better, {}),
        ]
    )
    lines = text.splitlines()
    assert lines[0].split() == ["system", "nDCG@10", "R@10", "R@100", "MRR@10", "Δ", "nDCG@10"]
    assert lines[3].split()[1:] == ["0.5000", "0.6000", "0.9000", "0.4000"]
    assert lines[4].split()[-1] == "+0.2500"
