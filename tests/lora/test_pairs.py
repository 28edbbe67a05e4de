"""Pairs and the split by law: whole laws on one side, deterministic, files in BEIR's
layout that read back as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lora.dataset import Pair, read_corpus, read_pairs, read_qrels, read_queries
from lora.gesetze import parse_law, read_laws
from lora.pairs import (
    MIN_WORDS,
    REFERENCES_PER_SECTION,
    PairKindError,
    Split,
    SplitError,
    pair_kinds,
    paragraph_pairs,
    reference_pairs,
    split_laws,
    write_sets,
)
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


MIETE = """\
---
Title: Testmietgesetz
jurabk: TMietG
---

# Testmietgesetz (TMietG)

### § 1 Mietvertrag

Durch den Mietvertrag wird der Vermieter verpflichtet, dem Mieter den Gebrauch zu gewähren.

### § 2 Kündigung

(1) Der Mieter kann nach § 1 den Vertrag jederzeit kündigen, wenn die Mietsache mangelhaft ist.

(2) Eine Kündigung nach Absatz 1 oder nach § 2 Satz 1 bedarf stets der Schriftform.

(3) Für die Frist der Kündigung gilt § 3 des Bürgerlichen Gesetzbuchs entsprechend.

(4) Die Rechte aus § 3 AGG bleiben dem Mieter auch nach der Kündigung erhalten.

(5) § 3 gilt entsprechend.

(6) Die Kündigung ist nach § 3 TMietG spätestens am dritten Werktag zulässig.

### § 3 Frist

Die Kündigung ist spätestens am dritten Werktag eines Kalendermonats zulässig.
"""


def test_paragraph_pairs_for_bodies_of_two_or_more_paragraphs(tmp_path: Path) -> None:
    laws = {law.slug: law for law in read_laws(write_laws(tmp_path / "laws"))}
    pairs = paragraph_pairs(laws["turlg"])
    # § 1 has one paragraph; § 8's lines ("Der Urlaub beträgt", "24 Tage,") are fragments
    assert pairs == [
        Pair("Dauer des Urlaubs", "(1) Der Urlaub beträgt jährlich mindestens 24 Werktage.",
             "turlg/§2", "turlg", "paragraph"),
        Pair("Dauer des Urlaubs", "(2) Als Werktage gelten alle Kalendertage, die nicht Sonn- "
             "oder gesetzliche Feiertage sind.", "turlg/§2", "turlg", "paragraph"),
    ]  # fmt: skip
    assert paragraph_pairs(laws["tkschg"]) == []


def test_short_paragraphs_make_no_pairs() -> None:
    body = "\n\n".join(["(1) weggefallen", "(2) Er beträgt vier Wochen.",
                        "(3) Der Urlaub beträgt fünf volle Wochen."])  # fmt: skip
    law = parse_law(f"# T\n\n### § 1 Urlaub\n\n{body}\n", "t")
    kept = [p.positive for p in paragraph_pairs(law)]
    assert kept == ["(3) Der Urlaub beträgt fünf volle Wochen."]  # four words fall short
    assert MIN_WORDS == 5


def test_reference_pairs_within_the_law() -> None:
    law = parse_law(MIETE, "tmietg")
    bodies = {s.id: s.body for s in law.sections}
    pairs = reference_pairs(law)
    assert [(p.query, p.id) for p in pairs] == [
        ("Der Mieter kann nach § 1 den Vertrag jederzeit kündigen, wenn die Mietsache "
         "mangelhaft ist.", "tmietg/§1"),
        # not § 2 itself (2), not another law's § 3 (3, 4), not a bare "§ 3 gilt" (5)
        ("Die Kündigung ist nach § 3 TMietG spätestens am dritten Werktag zulässig.",
         "tmietg/§3"),
    ]  # fmt: skip
    assert all(p.positive == bodies[p.id] and p.kind == "reference" for p in pairs)
    assert all(p.law == "tmietg" for p in pairs)


def test_reference_pairs_per_section_are_capped_and_deduplicated() -> None:
    sentences = [f"Der Mieter kann nach § 1 im Fall {n} den Vertrag kündigen." for n in range(8)]
    body = "\n\n".join([sentences[0], *sentences])  # the first one twice
    law = parse_law(f"# T\n\n### § 1 Miete\n\nDie Miete.\n\n### § 2 Fälle\n\n{body}\n", "t")
    pairs = reference_pairs(law)
    assert [p.query for p in pairs] == sentences[:REFERENCES_PER_SECTION]
    assert {p.id for p in pairs} == {"t/§1"}


def test_default_pairs_are_the_heading_pairs(tmp_path: Path) -> None:
    laws = read_laws(write_laws(tmp_path / "laws"))
    default, both = tmp_path / "default", tmp_path / "both"
    summary = write_sets(laws, default, eval_laws=["tverf"])
    write_sets(laws, both, eval_laws=["tverf"], pair_types=["paragraph", "heading"])
    rows = [json.loads(line) for line in (default / "train.jsonl").read_text().splitlines()]
    assert [r.pop("kind") for r in rows] == ["heading"] * len(rows)
    train = [law for law in laws if law.slug != "tverf"]
    assert rows == [
        {"query": s.title, "positive": s.body, "id": s.id, "law": s.law}
        for law in train
        for s in law.sections
    ]
    assert summary["pair_types"] == ["heading"]
    assert summary["pairs_by_kind"] == {"heading": len(rows)}
    again = json.loads((both / "split.json").read_text())
    assert again["pair_types"] == ["paragraph", "heading"]
    assert again["pairs_by_kind"] == {"paragraph": 2, "heading": len(rows)}
    for name in ("corpus.jsonl", "queries.jsonl", "qrels.tsv"):  # evaluation side unchanged
        assert (both / name).read_bytes() == (default / name).read_bytes()
    kinds = [p.kind for p in read_pairs(both / "train.jsonl")]
    assert kinds.count("paragraph") == 2 and kinds.count("heading") == len(rows)


def test_unknown_pair_kinds_name_the_valid_ones() -> None:
    with pytest.raises(PairKindError, match="heading, paragraph, reference"):
        pair_kinds(["heading", "sentence"])
    with pytest.raises(PairKindError, match="no pair type"):
        pair_kinds([])
    assert pair_kinds(["reference", "heading", "reference"]) == ("reference", "heading")


def test_eval_fraction_zero_trains_on_every_law_and_writes_no_evaluation(tmp_path: Path) -> None:
    assert split_laws({"a": 1, "b": 2, "c": 0}, eval_fraction=0, seed=0) == Split(("a", "b"), ())
    with pytest.raises(SplitError, match="no law"):
        split_laws({"c": 0}, eval_fraction=0, seed=0)
    laws = read_laws(write_laws(tmp_path / "laws"))
    out = tmp_path / "set"
    write_sets(laws, out, eval_laws=["turlg"])  # an earlier run's evaluation files
    summary = write_sets(laws, out, eval_fraction=0)
    assert summary["eval_laws"] == [] and summary["corpus"] == 0
    assert summary["train_pairs"] == sum(len(law.sections) for law in laws)
    assert not any((out / n).exists() for n in ("corpus.jsonl", "queries.jsonl", "qrels.tsv"))
