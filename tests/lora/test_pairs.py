"""Pairs and the split by law: whole laws on one side, deterministic, files in BEIR's
layout that read back as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lora.dataset import Pair, read_corpus, read_pairs, read_qrels, read_queries
from lora.gesetze import read_laws
from lora.pairs import Split, SplitError, split_laws, write_sets
from tests.lora.laws import write_laws

sizes = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=4), st.integers(0, 500), min_size=2, max_size=12
)


@settings(max_examples=200, deadline=None)
@given(sizes=sizes, fraction=st.floats(0.05, 0.95), seed=st.integers(0, 10_000))
def test_no_law_is_on_both_sides(sizes: dict[str, int], fraction: float, seed: int) -> None:
    with_sections = {slug for slug, n in sizes.items() if n > 0}
    if len(with_sections) < 2:
        with pytest.raises(SplitError):
            split_laws(sizes, eval_fraction=fraction, seed=seed)
        return
    split = split_laws(sizes, eval_fraction=fraction, seed=seed)
    assert not set(split.train) & set(split.eval)
    assert set(split.train) | set(split.eval) == with_sections
    assert split.train and split.eval
    assert split == split_laws(dict(reversed(sizes.items())), eval_fraction=fraction, seed=seed)


def test_the_split_comes_near_the_fraction() -> None:
    sizes = {f"law{i}": 100 for i in range(10)}
    split = split_laws(sizes, eval_fraction=0.3, seed=1)
    assert len(split.eval) == 3
    assert split != split_laws(sizes, eval_fraction=0.3, seed=2)


def test_named_eval_laws() -> None:
    split = split_laws({"a": 1, "b": 2, "c": 0}, eval_fraction=0.5, seed=0, eval_laws=["b"])
    assert (split.train, split.eval) == (("a",), ("b",))
    with pytest.raises(SplitError, match="unknown"):
        split_laws({"a": 1, "b": 2}, eval_fraction=0.5, seed=0, eval_laws=["x"])
    with pytest.raises(SplitError, match="both sides"):
        split_laws({"a": 1, "b": 2}, eval_fraction=0.5, seed=0, eval_laws=["a", "b"])


def test_eval_only_holds_nothing_for_training() -> None:
    sizes = {"a": 1, "b": 2, "c": 0}
    assert split_laws(sizes, eval_fraction=0.5, seed=0, eval_only=True) == Split((), ("a", "b"))
    named = split_laws(sizes, eval_fraction=0.5, seed=0, eval_laws=["a", "b"], eval_only=True)
    assert named == Split((), ("a", "b"))
    assert split_laws(sizes, eval_fraction=0.5, seed=0, eval_laws=["b"], eval_only=True) == Split(
        (), ("b",)
    )
    with pytest.raises(SplitError, match="has a section"):
        split_laws(sizes, eval_fraction=0.5, seed=0, eval_laws=["c"], eval_only=True)
    with pytest.raises(SplitError, match="no law"):
        split_laws({"c": 0}, eval_fraction=0.5, seed=0, eval_only=True)


def test_eval_only_sets_hold_every_law_and_no_training_file(tmp_path: Path) -> None:
    laws = read_laws(write_laws(tmp_path / "laws"))
    out = tmp_path / "set"
    write_sets(laws, out, eval_laws=["turlg"])  # an earlier run's train.jsonl
    assert (out / "train.jsonl").is_file()
    summary = write_sets(laws, out, eval_only=True)
    assert not (out / "train.jsonl").exists()
    assert summary["train_laws"] == [] and summary["train_pairs"] == 0
    assert summary["eval_laws"] == ["tkschg", "turlg", "tverf"]
    assert summary["eval_only"] is True and summary["train_sha256"] is None
    corpus = read_corpus(out / "corpus.jsonl")
    assert len(corpus) == sum(len(law.sections) for law in laws) == summary["corpus"]
    assert set(read_qrels(out / "qrels.tsv")) == set(read_queries(out / "queries.jsonl"))
    assert json.loads((out / "split.json").read_text())["eval_only"] is True


def test_written_sets(tmp_path: Path) -> None:
    laws = read_laws(write_laws(tmp_path / "laws"))
    out = tmp_path / "set"
    summary = write_sets(laws, out, eval_laws=["turlg"], source="laws")
    assert summary["train_laws"] == ["tkschg", "tverf"] and summary["eval_laws"] == ["turlg"]

    pairs = read_pairs(out / "train.jsonl")
    assert {p.law for p in pairs} == {"tkschg", "tverf"}
    assert pairs[0] == Pair(
        "Sozial ungerechtfertigte Kündigungen",
        "Die Kündigung ist rechtsunwirksam, wenn sie sozial ungerechtfertigt ist.",
        "tkschg/§1",
        "tkschg",
    )
    corpus = read_corpus(out / "corpus.jsonl")
    assert list(corpus) == ["turlg/§1", "turlg/§2", "turlg/§8", "turlg/§10a"]
    queries = read_queries(out / "queries.jsonl")
    qrels = read_qrels(out / "qrels.tsv")
    assert queries["q00002"] == "Dauer des Urlaubs"
    assert qrels["q00002"] == {"turlg/§2": 1}
    assert set(qrels) == set(queries)
    # corpus.jsonl is also an ingest file: id, text and metadata per line
    first = json.loads((out / "corpus.jsonl").read_text().splitlines()[0])
    assert first["metadata"] == {"law": "turlg", "number": "§ 1"}
    written = json.loads((out / "split.json").read_text())
    assert written["train_sha256"] == summary["train_sha256"]


def test_one_query_per_heading_with_every_section_it_heads(tmp_path: Path) -> None:
    laws = read_laws(write_laws(tmp_path / "laws"))
    write_sets(laws, tmp_path / "set", eval_laws=["turlg", "tkschg"])
    queries = read_queries(tmp_path / "set" / "queries.jsonl")
    qrels = read_qrels(tmp_path / "set" / "qrels.tsv")
    (qid,) = [q for q, text in queries.items() if text == "Dauer des Urlaubs"]
    assert qrels[qid] == {"tkschg/§3": 1, "turlg/§2": 1}


def test_qrels_as_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "qrels.jsonl"
    path.write_text('{"query-id": "q1", "corpus-id": "d1", "score": 2}\n')
    assert read_qrels(path) == {"q1": {"d1": 2}}
