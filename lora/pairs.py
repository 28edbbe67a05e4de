"""Training pairs from parsed laws, and an evaluation set, split by law.

Whole laws go to one side: the evaluation then measures how an adapter does on laws it
never saw, not how well it remembers their neighbours. The split is a pure function of
the laws' sizes, the wanted fraction and the seed.

Training pairs come in kinds (``PAIR_KINDS``), each a heading or a sentence paired with
text of one section and carrying that section's id, so that no mined negative
(``lora.negatives``) comes from the pair's own section:

``heading``    the heading -> the whole body
``paragraph``  the heading -> one paragraph, for bodies of two or more
``reference``  a sentence citing another section of its law ("nach § 823 Abs. 1") ->
               that section's body (``lora.citations`` reads the citations)

The evaluation side becomes a retrieval set: every kept section of the evaluation laws
is a passage, and every distinct heading is a query whose relevant passages are all the
sections that carry that heading ("Verjährung" heads sections in several laws).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lora.citations import cited_ids, count_words, sentences, words_outside_citations
from lora.dataset import Pair, Qrels, write_jsonl, write_qrels
from lora.gesetze import Law, Section

PAIR_KINDS = ("heading", "paragraph", "reference")
# Below five words a line or sentence is a remnant ("(1) weggefallen"), a list fragment
# ("bis zu 5 Jahren") or a lead-in ("Ordnungswidrig handelt, wer"): nothing a reader
# would match to a heading or a cited section.
MIN_WORDS = 5
# The first references to a section, in document order, and no more: the heavily cited
# ones (definitions, "§ 280") would otherwise fill the reference pairs.
REFERENCES_PER_SECTION = 5


class SplitError(ValueError):
    """The laws cannot be split as asked."""


class PairKindError(ValueError):
    """A pair kind that does not exist."""


def pair_kinds(names: Sequence[str]) -> tuple[str, ...]:
    """The kinds asked for, in the order given, each once."""
    unknown = [name for name in names if name not in PAIR_KINDS]
    if unknown or not names:
        raise PairKindError(
            f"unknown pair types {unknown}; the types are {', '.join(PAIR_KINDS)}"
            if unknown
            else f"no pair type given; the types are {', '.join(PAIR_KINDS)}"
        )
    return tuple(dict.fromkeys(names))


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

    ``eval_fraction`` 0 holds nothing out: every law with sections trains (the
    adapter that ships, once a recipe was chosen on a split).

    ``eval_only`` holds nothing for training: the evaluation side is ``eval_laws``, or
    every law with sections when none is named (a set that measures an adapter,
    trained elsewhere, on laws it never saw).
    """
    laws = sorted(slug for slug, n in sizes.items() if n > 0)
    if eval_laws:
        return _named_split(sizes, laws, eval_laws, eval_only=eval_only)
    if eval_only:
        if not laws:
            raise SplitError("no law has a section to evaluate on")
        return Split((), tuple(laws))
    if eval_fraction == 0:  # train on every law: the set an adapter ships with
        if not laws:
            raise SplitError("no law has a section to train on")
        return Split(tuple(laws), ())
    return _drawn_split(sizes, laws, eval_fraction=eval_fraction, seed=seed)


def _named_split(
    sizes: Mapping[str, int], laws: Sequence[str], eval_laws: Sequence[str], *, eval_only: bool
) -> Split:
    """``eval_laws`` held out (those with sections), the other ``laws`` training."""
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


def _drawn_split(
    sizes: Mapping[str, int], laws: Sequence[str], *, eval_fraction: float, seed: int
) -> Split:
    """The laws, shuffled with ``seed``, each held out if that brings the held-out share
    of sections closer to ``eval_fraction``; both sides keep at least one law."""
    if len(laws) < 2:
        raise SplitError(f"splitting by law needs two laws with sections, found {list(laws)}")
    if not 0 < eval_fraction < 1:
        raise SplitError(f"eval_fraction must be between 0 and 1, got {eval_fraction}")
    order = list(laws)
    random.Random(seed).shuffle(order)
    target = eval_fraction * sum(sizes[slug] for slug in laws)
    chosen: set[str] = set()
    held = 0
    for slug in order:
        if len(chosen) == len(laws) - 1:
            break
        if abs(held + sizes[slug] - target) < abs(held - target):
            chosen.add(slug)
            held += sizes[slug]
    if not chosen:  # every law alone overshoots the target by more than it helps
        chosen.add(min(order, key=lambda slug: sizes[slug]))
    return Split(
        tuple(slug for slug in laws if slug not in chosen),
        tuple(slug for slug in laws if slug in chosen),
    )


@dataclass(frozen=True, slots=True)
class RetrievalSet:
    corpus: list[Section]
    queries: dict[str, str]  # id -> text
    qrels: Qrels


def heading_pairs(law: Law) -> list[Pair]:
    return [Pair(s.title, s.body, s.id, s.law, "heading") for s in law.sections]


def paragraph_pairs(law: Law) -> list[Pair]:
    pairs = []
    for s in law.sections:
        paragraphs = s.body.split("\n")
        if len(paragraphs) > 1:
            pairs += [
                Pair(s.title, text, s.id, s.law, "paragraph")
                for text in paragraphs
                if count_words(text) >= MIN_WORDS
            ]
    return pairs


def reference_pairs(law: Law) -> list[Pair]:
    by_id = {s.id: s for s in law.sections}
    numbers: dict[str, list[str]] = {}  # "§" -> ["1", "2", "2a", ...], in document order
    for s in law.sections:
        kind, _, number = s.number.partition(" ")
        if " " not in number:  # not a range ("§§ 3 bis 6") nor a repeat ("§ 5 (2)")
            numbers.setdefault(kind, []).append(number)
    pairs: list[Pair] = []
    per_target: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    for s in law.sections:
        for paragraph in s.body.split("\n"):
            for sentence in sentences(paragraph):
                if words_outside_citations(sentence) < MIN_WORDS:
                    continue  # "§ 5 gilt entsprechend." names a number, nothing to match
                for target in dict.fromkeys(
                    cited_ids(sentence, law.slug, law.abbreviation, numbers)
                ):
                    if target == s.id or (sentence, target) in seen:
                        continue
                    if per_target[target] >= REFERENCES_PER_SECTION:
                        continue
                    seen.add((sentence, target))
                    per_target[target] += 1
                    pairs.append(Pair(sentence, by_id[target].body, target, law.slug, "reference"))
    return pairs


_BUILDERS: dict[str, Callable[[Law], list[Pair]]] = {
    "heading": heading_pairs,
    "paragraph": paragraph_pairs,
    "reference": reference_pairs,
}


def train_pairs(laws: Sequence[Law], kinds: Sequence[str] = ("heading",)) -> list[Pair]:
    """Pairs of the given kinds, law by law, each law's in the order of ``PAIR_KINDS``."""
    wanted = pair_kinds(kinds)
    return [
        p for law in laws for kind in PAIR_KINDS if kind in wanted for p in _BUILDERS[kind](law)
    ]


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


EVAL_FILES = ("corpus.jsonl", "queries.jsonl", "qrels.tsv")


def _write_train(path: Path, pairs: Sequence[Pair], *, eval_only: bool) -> str | None:
    """The training pairs and their hash; with ``eval_only`` none, and no file (one from
    an earlier run is removed: split.json must describe the folder as it is)."""
    if eval_only:
        path.unlink(missing_ok=True)
        return None
    write_jsonl(
        path,
        (
            {"query": p.query, "positive": p.positive, "id": p.id, "law": p.law, "kind": p.kind}
            for p in pairs
        ),
    )
    return file_sha256(path)


def _write_retrieval_set(out: Path, held_out: RetrievalSet) -> None:
    corpus, queries, qrels = (out / name for name in EVAL_FILES)
    write_jsonl(
        corpus,
        (
            {"id": s.id, "text": s.body, "metadata": {"law": s.law, "number": s.number}}
            for s in held_out.corpus
        ),
    )
    write_jsonl(queries, ({"id": k, "text": v} for k, v in held_out.queries.items()))
    write_qrels(qrels, held_out.qrels)


def _summary(
    laws: Sequence[Law],
    split: Split,
    pairs: Sequence[Pair],
    held_out: RetrievalSet,
    *,
    kinds: Sequence[str],
    train_sha: str | None,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """What split.json holds: the settings, then the laws, the pairs and the retrieval set."""
    return settings | {
        "train_laws": list(split.train),
        "eval_laws": list(split.eval),
        "unused_laws": sorted({law.slug for law in laws} - set(split.train) - set(split.eval)),
        "train_pairs": len(pairs),
        "pair_types": list(kinds),
        "pairs_by_kind": {kind: sum(p.kind == kind for p in pairs) for kind in kinds},
        "train_sha256": train_sha,
        "corpus": len(held_out.corpus),
        "queries": len(held_out.queries),
        "judgements": sum(len(v) for v in held_out.qrels.values()),
        "sections_dropped": {law.slug: law.dropped for law in laws},
    }


def write_sets(
    laws: Sequence[Law],
    out: Path,
    *,
    eval_fraction: float = 0.2,
    seed: int = 0,
    eval_laws: Sequence[str] = (),
    eval_only: bool = False,
    pair_types: Sequence[str] = ("heading",),
    source: str = "",
) -> dict[str, Any]:
    """Write train.jsonl, corpus.jsonl, queries.jsonl, qrels.tsv and split.json under
    ``out``; returns what split.json holds. With nothing held out there are no
    evaluation files, and with ``eval_only`` there is no train.jsonl
    (one left from an earlier run in ``out`` is removed: split.json must describe the
    folder as it is)."""
    kinds = pair_kinds(pair_types)
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
    pairs = train_pairs([by_slug[slug] for slug in split.train], kinds)
    train_sha = _write_train(out / "train.jsonl", pairs, eval_only=eval_only)
    held_out = retrieval_set([by_slug[slug] for slug in split.eval])
    if split.eval:
        _write_retrieval_set(out, held_out)
    else:  # nothing held out: no evaluation files (an earlier run's removed)
        for name in EVAL_FILES:
            (out / name).unlink(missing_ok=True)
    settings = {
        "source": source,
        "seed": seed,
        "eval_fraction": None if eval_only else eval_fraction,
        "eval_only": eval_only,
    }
    summary = _summary(
        laws, split, pairs, held_out, kinds=kinds, train_sha=train_sha, settings=settings
    )
    (out / "split.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary
