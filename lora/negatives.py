"""Hard negatives mined per query, for the contrastive loss to push away beside the
batch's other passages.

Candidates come from the training passages themselves, ranked for each query by the
base model (``sentence_transformers.util.mine_hard_negatives``, with serving's query
and passage prompts), by BM25 (``lora.bm25``), or by both (their survivors taken in
turn). A candidate is a false negative, and never kept, when it

- comes from the same section as the positive (the same law and section id), or from
  a section with the query's heading: it answers the query as well as the positive;
- scores at least as high as the positive, less a relative margin (NV-Retriever's
  TopK-PercPos): what the ranker cannot tell from the positive is likely relevant too.

The survivors are taken best first ("top" sampling), up to ``count`` per query; both
filters' drops are counted, for the manifest.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lora.bm25 import bm25_scores
from lora.dataset import Pair

Source = Literal["model", "bm25", "both"]
# per pair: the positive's score, then (passage index, score) candidates, best first
Ranked = list[tuple[float, list[tuple[int, float]]]]


@dataclass(frozen=True, slots=True)
class MiningStats:
    source: str
    per_query: int  # negatives asked for per query
    margin: float
    candidates_per_query: int  # the top candidates each ranker offers per query
    candidates: int  # candidates examined, all rankers together
    dropped_same_section: int
    dropped_score: int
    negatives: int  # kept, all queries together
    pairs_full: int  # pairs that got all ``per_query``
    pairs_short: int  # some, fewer than asked
    pairs_none: int  # none: they train on in-batch negatives only
    mining_s: float


@dataclass(frozen=True, slots=True)
class Mined:
    negatives: list[list[str]]  # per pair, in the pairs' order, best first
    stats: MiningStats


class _Passages:
    """The distinct positives, and for each the sections and headings it stands for."""

    def __init__(self, pairs: Sequence[Pair]) -> None:
        self.index: dict[str, int] = {}
        self.sections: list[set[tuple[str, str]]] = []
        self.headings: list[set[str]] = []
        for pair in pairs:
            i = self.index.setdefault(pair.positive, len(self.index))
            if i == len(self.sections):
                self.sections.append(set())
                self.headings.append(set())
            if pair.id:
                self.sections[i].add((pair.law, pair.id))
            self.headings[i].add(pair.query)
        self.texts = list(self.index)


def _rank_by_model(
    pairs: Sequence[Pair],
    passages: _Passages,
    model: Any,
    prompts: dict[str, str],
    k: int,
    batch_size: int,
) -> Ranked:
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    found = mine_hard_negatives(
        Dataset.from_dict(
            {"query": [p.query for p in pairs], "positive": [p.positive for p in pairs]}
        ),
        model,
        corpus=passages.texts,
        num_negatives=min(k, len(passages.texts)),
        sampling_strategy="top",
        # a plain prefix, as serving puts it ('' is no prompt, not the model's default)
        query_prompt=prompts["query"],
        corpus_prompt=prompts["passage"],
        output_format="labeled-list",  # every candidate with its score; filtered below
        output_scores=True,
        batch_size=batch_size,
        verbose=False,
    )
    by_pair: dict[tuple[str, str], tuple[float, list[tuple[int, float]]]] = {}
    for query, texts, scores in zip(
        found["query"], found["positive"], found["scores"], strict=True
    ):
        by_pair[(query, texts[0])] = (
            float(scores[0]),
            [(passages.index[t], float(s)) for t, s in zip(texts[1:], scores[1:], strict=True)],
        )
    return [by_pair.get((p.query, p.positive), (float("inf"), [])) for p in pairs]


def _rank_by_bm25(pairs: Sequence[Pair], passages: _Passages, k: int, language: str) -> Ranked:
    queries = list(dict.fromkeys(p.query for p in pairs))
    # a heading's every passage is a positive of that heading, as mine_hard_negatives
    # treats a repeated query; they are left out of its candidates
    positives: dict[str, set[int]] = {q: set() for q in queries}
    for pair in pairs:
        positives[pair.query].add(passages.index[pair.positive])
    rows: dict[str, tuple[np.ndarray, list[tuple[int, float]]]] = {}
    scored = bm25_scores(passages.texts, queries, language=language)
    for query, scores in zip(queries, scored, strict=True):
        own = positives[query]
        top = np.argsort(-scores, kind="stable")[: k + len(own)]
        ranked = [(int(i), float(scores[i])) for i in top if int(i) not in own and scores[i] > 0]
        rows[query] = (scores, ranked[:k])
    ranked_pairs: Ranked = []
    for pair in pairs:
        scores, candidates = rows[pair.query]
        ranked_pairs.append((float(scores[passages.index[pair.positive]]), candidates))
    return ranked_pairs


@dataclass(slots=True)
class _Drops:
    candidates: int = 0
    same_section: int = 0
    score: int = 0


def _survivors(
    pair: Pair,
    positive_score: float,
    candidates: Iterable[tuple[int, float]],
    passages: _Passages,
    margin: float,
    drops: _Drops,
) -> list[int]:
    """The candidates that are no false negative of ``pair``, in their order."""
    section = (pair.law, pair.id) if pair.id else None
    threshold = positive_score - abs(positive_score) * margin
    kept = []
    for index, score in candidates:
        drops.candidates += 1
        if pair.query in passages.headings[index] or section in passages.sections[index]:
            drops.same_section += 1
        elif score >= threshold:
            drops.score += 1
        else:
            kept.append(index)
    return kept


def _take_in_turn(lists: Sequence[list[int]], count: int) -> list[int]:
    taken: list[int] = []
    for row in range(max((len(x) for x in lists), default=0)):
        for candidates in lists:
            if row < len(candidates) and candidates[row] not in taken:
                taken.append(candidates[row])
    return taken[:count]


def mine(
    pairs: Sequence[Pair],
    *,
    count: int,
    source: Source,
    margin: float,
    candidates_per_query: int,
    model: Any = None,
    prompts: dict[str, str] | None = None,
    language: str = "de",
    batch_size: int = 32,
    quiet: bool = False,
) -> Mined:
    """Up to ``count`` hard negatives for each pair (see the module's docstring).

    ``model`` is the base (needed unless ``source`` is "bm25"); ``quiet`` keeps the
    encoder's progress bars off the terminal (for logs that are not one)."""
    started = time.perf_counter()
    passages = _Passages(pairs)
    rankers: list[Callable[[], Ranked]] = []
    if source in ("model", "both"):
        if model is None:
            raise ValueError("mining with the model needs the model")
        shown = prompts or {"query": "", "passage": ""}
        rankers.append(
            lambda: _rank_by_model(pairs, passages, model, shown, candidates_per_query, batch_size)
        )
    if source in ("bm25", "both"):
        rankers.append(lambda: _rank_by_bm25(pairs, passages, candidates_per_query, language))
    sink = contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext()
    with sink:
        rankings = [rank() for rank in rankers]
    drops = _Drops()
    negatives: list[list[str]] = []
    for i, pair in enumerate(pairs):
        kept = [
            _survivors(pair, ranking[i][0], ranking[i][1], passages, margin, drops)
            for ranking in rankings
        ]
        negatives.append([passages.texts[j] for j in _take_in_turn(kept, count)])
    got = [len(n) for n in negatives]
    stats = MiningStats(
        source=source,
        per_query=count,
        margin=margin,
        candidates_per_query=candidates_per_query,
        candidates=drops.candidates,
        dropped_same_section=drops.same_section,
        dropped_score=drops.score,
        negatives=sum(got),
        pairs_full=sum(1 for n in got if n >= count),
        pairs_short=sum(1 for n in got if 0 < n < count),
        pairs_none=sum(1 for n in got if n == 0),
        mining_s=time.perf_counter() - started,
    )
    return Mined(negatives, stats)


def describe(stats: MiningStats) -> str:
    pairs = stats.pairs_full + stats.pairs_short + stats.pairs_none
    return (
        f"hard negatives ({stats.source}): {stats.negatives} for {pairs} pairs "
        f"({stats.pairs_full} with all {stats.per_query}, {stats.pairs_short} fewer, "
        f"{stats.pairs_none} none); dropped {stats.dropped_same_section} same-section and "
        f"{stats.dropped_score} scoring within {stats.margin:.0%} of the positive, of "
        f"{stats.candidates} candidates; {stats.mining_s:.1f} s"
    )


def columns(pairs: Sequence[Pair], negatives: Sequence[list[str]], count: int) -> dict[str, Any]:
    """Training rows (anchor, positive, negative_1..count) for the pairs that got at
    least one negative, and plain (anchor, positive) rows for the rest.

    A row short of ``count`` repeats its own negatives to fill the columns (every row of
    one data set has the same columns): a repeated negative weighs twice in the loss,
    where a stranger's passage would be no hard negative at all."""
    hard = [i for i, n in enumerate(negatives) if n]
    rest = [i for i, n in enumerate(negatives) if not n]
    with_negatives: dict[str, list[str]] = {
        "query": [pairs[i].query for i in hard],
        "positive": [pairs[i].positive for i in hard],
    }
    for column in range(count):
        with_negatives[f"negative_{column + 1}"] = [
            negatives[i][column % len(negatives[i])] for i in hard
        ]
    plain = {"query": [pairs[i].query for i in rest], "positive": [pairs[i].positive for i in rest]}
    return {"hard": with_negatives, "pairs": plain}
