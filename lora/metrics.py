"""Retrieval metrics, as BEIR reports them (trec_eval's definitions).

A run maps each query to its ranked document ids, best first; qrels map each query to
its judged documents and grades (above 0: relevant). Every metric is averaged over the
queries that have at least one relevant document; a query the run left out scores 0.

- nDCG@k: DCG = sum over ranks i = 1..k of grade_i / log2(i + 1) (linear gain, as in
  trec_eval and BEIR), divided by the DCG of the ideal ranking of the judged documents.
- recall@k: relevant documents in the top k / all relevant documents of the query
  (BEIR's definition: not capped at k, so a query with more than k relevant documents
  cannot reach 1).
- MRR@k: 1 / rank of the first relevant document in the top k, 0 if there is none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Run = Mapping[str, Sequence[str]]  # query id -> document ids, best first
Qrels = Mapping[str, Mapping[str, int]]

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")


def ndcg_at_k(ranked: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    dcg = sum(
        judged.get(doc, 0) / math.log2(rank + 1)
        for rank, doc in enumerate(ranked[:k], 1)
        if judged.get(doc, 0) > 0
    )
    ideal_grades = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    ideal = sum(g / math.log2(rank + 1) for rank, g in enumerate(ideal_grades, 1))
    return dcg / ideal if ideal > 0 else 0.0


def recall_at_k(ranked: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    relevant = {doc for doc, g in judged.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    for rank, doc in enumerate(ranked[:k], 1):
        if judged.get(doc, 0) > 0:
            return 1.0 / rank
    return 0.0


def per_query(run: Run, qrels: Qrels) -> dict[str, dict[str, float]]:
    """Every metric of every query with a relevant document."""
    out: dict[str, dict[str, float]] = {}
    for qid, judged in qrels.items():
        if not any(g > 0 for g in judged.values()):
            continue
        ranked = run.get(qid, ())
        out[qid] = {
            "ndcg@10": ndcg_at_k(ranked, judged, 10),
            "recall@10": recall_at_k(ranked, judged, 10),
            "recall@100": recall_at_k(ranked, judged, 100),
            "mrr@10": mrr_at_k(ranked, judged, 10),
        }
    return out


def mean_metrics(scores: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    if not scores:
        return dict.fromkeys(METRICS, 0.0)
    return {m: sum(s[m] for s in scores.values()) / len(scores) for m in METRICS}


def evaluate(run: Run, qrels: Qrels) -> dict[str, float]:
    return mean_metrics(per_query(run, qrels))
