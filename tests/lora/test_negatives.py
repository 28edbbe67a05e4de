"""Hard negatives on a handful of sections: a passage of the positive's own section or
one scoring as high as the positive never becomes a negative, N come out where there
are N, and training runs on them with the counts in the manifest."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sentence_transformers.sentence_transformer.data_collator import (
    SentenceTransformerDataCollator as Collator,
)

from lora.bm25 import bm25_scores
from lora.config import Prices, TrainConfig
from lora.dataset import Pair, write_jsonl
from lora.manifest import MANIFEST_NAME
from lora.negatives import columns, mine
from lora.train import BaseModelRef, train
from tests.gateway.conftest import hub_offline

QUERY = "Dauer des Urlaubs"
POSITIVE = "Der Urlaub beträgt jährlich 24 Werktage; die Dauer richtet sich nach dem Jahr."
# the same section's second paragraph, as paragraph pairs give it: lexically the closest
SAME_SECTION = (
    "Die Dauer des Urlaubs verlängert sich, Dauer des Urlaubs und Urlaub für Jugendliche."
)
# another law's passage that outscores the positive: a false negative by its score
LOOK_ALIKE = "Dauer des Urlaubs: Urlaub, Urlaub, Dauer, Dauer des Urlaubs nach dem Jahr."
HARD = [  # share a word or two with the query, fewer than the positive
    "Der Urlaub ist zusammenhängend zu gewähren, wenn nicht dringende Gründe entgegenstehen.",
    "Kann der Urlaub wegen Beendigung des Arbeitsverhältnisses nicht gewährt werden.",
    "Während des Urlaubs darf der Arbeitnehmer keine Erwerbstätigkeit leisten.",
]

PAIRS = [
    Pair(QUERY, POSITIVE, "turlg/§3", "turlg"),
    Pair("Verlängerung für Jugendliche", SAME_SECTION, "turlg/§3", "turlg"),
    Pair("Sonderurlaub der Beamten", LOOK_ALIKE, "beamtg/§9", "beamtg"),
    Pair("Zusammenhängende Gewährung", HARD[0], "turlg/§7", "turlg"),
    Pair("Abgeltung", HARD[1], "turlg/§7a", "turlg"),
    Pair("Erwerbstätigkeit während des Urlaubs", HARD[2], "turlg/§8", "turlg"),
    Pair(
        "Kündigungsfrist",
        "Das Arbeitsverhältnis endet nach vier Wochen Frist.",
        "kschg/§1",
        "kschg",
    ),
    Pair("Miete", "Der Mieter zahlt die Miete monatlich im Voraus.", "bgb/§556b", "bgb"),
]


def test_bm25_scores_rank_the_look_alike_above_the_positive() -> None:
    # the premise of the next test: the scores the filter sees
    texts = [p.positive for p in PAIRS]
    (scores,) = bm25_scores(texts, [QUERY])
    assert scores[1] > scores[0] and scores[2] > scores[0]  # same section, look-alike
    assert all(0 < scores[i] < scores[0] for i in (3, 4, 5))
    assert scores[6] == 0 and scores[7] == 0


def test_the_filters_drop_the_same_section_and_the_look_alike() -> None:
    mined = mine(PAIRS, count=2, source="bm25", margin=0.0, candidates_per_query=10)
    negatives = mined.negatives[0]
    assert len(negatives) == 2 and set(negatives) <= set(HARD)
    assert SAME_SECTION not in negatives and LOOK_ALIKE not in negatives
    assert POSITIVE not in negatives
    for pair, found in zip(PAIRS, mined.negatives, strict=True):
        section_texts = {p.positive for p in PAIRS if p.id == pair.id}
        assert not section_texts & set(found)
    stats = mined.stats
    assert stats.dropped_same_section >= 1  # the second paragraph, for the first
    assert stats.dropped_score >= 1
    assert stats.candidates >= stats.dropped_same_section + stats.dropped_score + stats.negatives
    assert stats.pairs_full + stats.pairs_short + stats.pairs_none == len(PAIRS)


def test_the_margin_drops_what_scores_close_below_the_positive() -> None:
    texts = [p.positive for p in PAIRS]
    (scores,) = bm25_scores(texts, [QUERY])
    # margins that put the threshold just below and just above the weakest hard negative
    weakest = min(scores[i] for i in (3, 4, 5))
    edge = float(1 - weakest / scores[0])
    none = mine(PAIRS, count=3, source="bm25", margin=edge + 1e-4, candidates_per_query=10)
    one = mine(PAIRS, count=3, source="bm25", margin=edge - 1e-4, candidates_per_query=10)
    loose = mine(PAIRS, count=3, source="bm25", margin=0.0, candidates_per_query=10)
    assert len(loose.negatives[0]) == 3
    assert none.negatives[0] == []
    assert one.negatives[0] == [PAIRS[3 + [scores[i] for i in (3, 4, 5)].index(weakest)].positive]
    assert none.stats.dropped_score > one.stats.dropped_score > loose.stats.dropped_score


def test_n_negatives_come_out_where_there_are_n_best_first() -> None:
    texts = [p.positive for p in PAIRS]
    (scores,) = bm25_scores(texts, [QUERY])
    mined = mine(PAIRS, count=3, source="bm25", margin=0.0, candidates_per_query=10)
    assert mined.negatives[0] == sorted(HARD, key=lambda t: -scores[texts.index(t)])
    assert mined.negatives[7] == []  # "Miete" shares no word with another passage
    rows = columns(PAIRS, mined.negatives, 3)
    assert len(rows["hard"]["query"]) + len(rows["pairs"]["query"]) == len(PAIRS)
    assert rows["hard"]["negative_3"][0] == mined.negatives[0][2]


@pytest.mark.slow
def test_the_base_model_never_keeps_a_negative_it_scores_as_high_as_the_positive(
    tiny_models: dict[str, Path],
) -> None:
    from sentence_transformers import SentenceTransformer

    with hub_offline():
        model = SentenceTransformer(str(tiny_models["tiny-a"]), device="cpu")
    prompts = {"query": "query: ", "passage": "passage: "}
    mined = mine(PAIRS, count=7, source="model", margin=0.05, candidates_per_query=7,
                 model=model, prompts=prompts, quiet=True)  # fmt: skip
    stats = mined.stats
    assert stats.candidates > 0 and stats.dropped_same_section >= 2
    assert stats.dropped_score + stats.negatives + stats.dropped_same_section == stats.candidates
    for pair, found in zip(PAIRS, mined.negatives, strict=True):
        assert pair.positive not in found
        assert not {p.positive for p in PAIRS if p.id == pair.id} & set(found)
        # scored with the prompts serving puts before the texts
        q = model.encode(["query: " + pair.query], normalize_embeddings=True)
        d = model.encode(["passage: " + t for t in [pair.positive, *found]],
                         normalize_embeddings=True)  # fmt: skip
        cos = (q @ d.T)[0]
        assert np.all(cos[1:] < cos[0] - abs(cos[0]) * 0.05 + 1e-5)
    with_both = mine(PAIRS, count=2, source="both", margin=0.05, candidates_per_query=7,
                     model=model, prompts=prompts, quiet=True)  # fmt: skip
    assert all(len(found) <= 2 for found in with_both.negatives)
    assert with_both.stats.candidates > stats.candidates  # BM25's candidates on top


@pytest.mark.slow
def test_training_runs_on_mined_negatives_and_records_them(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pairs = tmp_path / "train.jsonl"
    write_jsonl(pairs, ({"query": p.query, "positive": p.positive, "id": p.id, "law": p.law}
                        for p in PAIRS))  # fmt: skip
    knobs = TrainConfig.model_validate(
        {
            "lora_rank": 4,
            "lora_alpha": 8,
            "lora_dropout": 0.0,
            "lora_targets": ["query", "value"],
            "train_batch_size": 2,
            "train_lr": 1e-2,
            "train_max_seq_tokens": 32,
            "train_max_steps": 2,
            "train_negatives": 2,
            "train_negatives_from": "both",
            "train_negatives_margin": 0.0,
        }
    )
    seen: list[dict[str, Any]] = []
    real_call = Collator.__call__

    def recording(self: Collator, features: list[dict[str, Any]]) -> object:
        seen.extend(features)
        return real_call(self, features)

    monkeypatch.setattr(Collator, "__call__", recording)
    log = io.StringIO()
    with hub_offline():
        manifest = train(BaseModelRef(tiny_models["tiny-a"]), pairs, tmp_path / "out", knobs,
                         Prices(), progress_stream=log)  # fmt: skip
    assert manifest.training.steps == 2 and manifest.metrics.loss_first > 0
    assert any("negative_2" in row for row in seen)
    assert "hard negatives (both):" in log.getvalue()
    written = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    record = written["training"]["negatives"]
    assert record["source"] == "both" and record["per_query"] == 2
    assert record["dropped_same_section"] >= 2 and record["negatives"] > 0
    assert record["mining_s"] > 0
