"""Heading -> body pairs from parsed laws, split by law.

Whole laws go to one side: the evaluation then measures how an adapter does on laws it
never saw, not how well it remembers their neighbours. The split is a pure function of
the laws' sizes, the wanted fraction and the seed.

The evaluation side becomes a retrieval set: every kept section of the evaluation laws
is a passage, and every distinct heading is a query whose relevant passages are all the
sections that carry that heading ("Verjährung" heads sections in several laws).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lora.dataset import Pair, Qrels, write_jsonl, write_qrels
from lora.gesetze import Law, Section


class SplitError(ValueError):
    """The laws cannot be split as asked."""


@dataclass(frozen=True, slots=True)
class Split:
    train: tuple[str, ...]
    eval: tuple[str, ...]


def split_laws(
    sizes: Mapping[str, int],
    *,
    eval_fraction: float,
    seed: int,
    eval_laws: Sequence[str] = (),
    eval_only: bool = False,
) -> Split:
    """Laws (slug -> number of sections) into train and evaluation sides.

    ``eval_laws`` names the evaluation side outright. Otherwise the laws are shuffled
    with ``seed`` and each one joins the evaluation side if that brings its share of
    sections closer to ``eval_fraction``; both sides keep at least one law. Laws
    without sections take no side.

    ``eval_only`` holds nothing for training: the evaluation side is ``eval_laws``, or
    every law with sections when none is named (a set that measures an adapter,
    trained elsewhere, on laws it never saw).
    """
    laws = sorted(slug for slug, n in sizes.items() if n > 0)
    if eval_laws:
        unknown = sorted(set(eval_laws) - set(sizes))
        if unknown:
            raise SplitError(f"unknown laws {unknown}; the laws are {sorted(sizes)}")
        chosen = sorted(set(eval_laws) & set(laws))
        train: tuple[str, ...] = ()
        if not eval_only:
            train = tuple(slug for slug in laws if slug not in chosen)
        if not chosen:
            raise SplitError(f"none of the laws {sorted(set(eval_laws))} has a section")
        if not train and not eval_only:
            raise SplitError(
                "both sides of the split need a law with sections; to hold every named "
                "law out for evaluation, with nothing for training, pass --eval-only"
            )
        return Split(train, tuple(chosen))
    if eval_only:
        if not laws:
            raise SplitError("no law has a section to evaluate on")
        return Split((), tuple(laws))
    if len(laws) < 2:
        raise SplitError(f"splitting by law needs two laws with sections, found {laws}")
    if not 0 < eval_fraction < 1:
        raise SplitError(f"eval_fraction must be between 0 and 1, got {eval_fraction}")
    order = laws.copy()
    random.Random(seed).shuffle(order)
    total = sum(sizes[slug] for slug in laws)
    target = eval_fraction * total
    chosen_set: set[str] = set()
    held = 0
    for slug in order:
        if len(chosen_set) == len(laws) - 1:
            break
        if abs(held + sizes[slug] - target) < abs(held - target):
            chosen_set.add(slug)
            held += sizes[slug]
    if not chosen_set:  # every law alone overshoots the target by more than it helps
        chosen_set.add(min(order, key=lambda slug: sizes[slug]))
    return Split(
        tuple(slug for slug in laws if slug not in chosen_set),
        tuple(slug for slug in laws if slug in chosen_set),
    )


@dataclass(frozen=True, slots=True)
class RetrievalSet:
    corpus: list[Section]
    queries: dict[str, str]  # id -> text
    qrels: Qrels


def train_pairs(laws: Sequence[Law]) -> list[Pair]:
    return [Pair(s.title, s.body, s.id, s.law) for law in laws for s in law.sections]


def retrieval_set(laws: Sequence[Law]) -> RetrievalSet:
    corpus = [s for law in laws for s in law.sections]
    ids: dict[str, str] = {}  # heading -> query id, in order of first appearance
    qrels: Qrels = {}
    for section in corpus:
        qid = ids.setdefault(section.title, f"q{len(ids) + 1:05d}")
        qrels.setdefault(qid, {})[section.id] = 1
    return RetrievalSet(corpus, {qid: title for title, qid in ids.items()}, qrels)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sets(
    laws: Sequence[Law],
    out: Path,
    *,
    eval_fraction: float = 0.2,
    seed: int = 0,
    eval_laws: Sequence[str] = (),
    eval_only: bool = False,
    source: str = "",
) -> dict[str, Any]:
    """Write train.jsonl, corpus.jsonl, queries.jsonl, qrels.tsv and split.json under
    ``out``; returns what split.json holds. With ``eval_only`` there is no train.jsonl
    (one left from an earlier run in ``out`` is removed: split.json must describe the
    folder as it is)."""
    by_slug = {law.slug: law for law in laws}
    if len(by_slug) != len(laws):
        raise SplitError("two laws share a slug (file name)")
    split = split_laws(
        {law.slug: len(law.sections) for law in laws},
        eval_fraction=eval_fraction,
        seed=seed,
        eval_laws=eval_laws,
        eval_only=eval_only,
    )
    out.mkdir(parents=True, exist_ok=True)
    pairs = train_pairs([by_slug[slug] for slug in split.train])
    train_file = out / "train.jsonl"
    if eval_only:
        train_file.unlink(missing_ok=True)
    else:
        write_jsonl(
            train_file,
            ({"query": p.query, "positive": p.positive, "id": p.id, "law": p.law} for p in pairs),
        )
    held_out = retrieval_set([by_slug[slug] for slug in split.eval])
    write_jsonl(
        out / "corpus.jsonl",
        (
            {"id": s.id, "text": s.body, "metadata": {"law": s.law, "number": s.number}}
            for s in held_out.corpus
        ),
    )
    write_jsonl(out / "queries.jsonl", ({"id": k, "text": v} for k, v in held_out.queries.items()))
    write_qrels(out / "qrels.tsv", held_out.qrels)
    summary: dict[str, Any] = {
        "source": source,
        "seed": seed,
        "eval_fraction": None if eval_only else eval_fraction,
        "eval_only": eval_only,
        "train_laws": list(split.train),
        "eval_laws": list(split.eval),
        "unused_laws": sorted(set(by_slug) - set(split.train) - set(split.eval)),
        "train_pairs": len(pairs),
        "train_sha256": None if eval_only else file_sha256(train_file),
        "corpus": len(held_out.corpus),
        "queries": len(held_out.queries),
        "judgements": sum(len(v) for v in held_out.qrels.values()),
        "sections_dropped": {law.slug: law.dropped for law in laws},
    }
    (out / "split.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary
