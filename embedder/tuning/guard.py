"""The accuracy guard: a faster candidate counts only if it computes the same model.

Every candidate's vectors on the calibration texts must stay within cosine MIN_COSINE
of torch fp32's, text by text (the worst text decides, not the mean). A candidate
below bf16 precision (int8) can pass that and still reorder close neighbours, so it
must also keep retrieval quality: nDCG@10 on a labelled set within MAX_NDCG_DROP of
fp32's. Pure functions of the outputs; the search measures them.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedder.core.fleet import Precision
from embedder.tasks.embed.runtimes import MIN_COSINE

MAX_NDCG_DROP = 0.005
# Precisions whose rounding is coarse enough that cosine alone does not vouch for them.
BELOW_BF16: frozenset[Precision] = frozenset({"int8"})


def needs_retrieval_check(dtype: Precision) -> bool:
    return dtype in BELOW_BF16


@dataclass(frozen=True, slots=True)
class Verdict:
    worst_cosine: float
    ndcg: float | None  # None where the check did not apply
    refused: str | None  # why, when the candidate fails the guard

    @property
    def passed(self) -> bool:
        return self.refused is None


def judge(
    dtype: Precision,
    cosine: float,
    ndcg: float | None = None,
    ndcg_fp32: float | None = None,
) -> Verdict:
    """Pass or refuse a candidate on its worst cosine and, below bf16, its nDCG@10."""
    if not cosine >= MIN_COSINE:  # NaN (a broken output) fails too
        return Verdict(cosine, ndcg, f"worst cosine {cosine:.5f} < {MIN_COSINE}")
    if needs_retrieval_check(dtype):
        if ndcg is None or ndcg_fp32 is None:
            why = f"{dtype} needs the retrieval check (nDCG@10) and no labelled set was given"
            return Verdict(cosine, ndcg, why)
        if ndcg < ndcg_fp32 - MAX_NDCG_DROP:
            why = f"nDCG@10 {ndcg:.4f} < fp32's {ndcg_fp32:.4f} - {MAX_NDCG_DROP}"
            return Verdict(cosine, ndcg, why)
    return Verdict(cosine, ndcg, None)
