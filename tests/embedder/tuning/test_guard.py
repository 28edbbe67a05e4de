"""The guard on its own: cosine for every candidate, nDCG too below bf16."""

from __future__ import annotations

import numpy as np
import pytest

from embedder.tasks.embed.runtimes import worst_cosine
from embedder.tuning.guard import MAX_NDCG_DROP, judge


def test_the_worst_text_decides_not_the_mean() -> None:
    ref = np.eye(4, dtype=np.float32)
    out = ref.copy()
    out[2] = [0.0, 0.3, 1.0, 0.0]  # one text moved
    assert worst_cosine(ref, out) == pytest.approx(1 / np.sqrt(1.09))
    with pytest.raises(ValueError, match="shape"):
        worst_cosine(ref, out[:3])


def test_cosine_below_the_bound_or_nan_is_refused() -> None:
    assert judge("bfloat16", 0.9995).passed
    assert "worst cosine 0.99800 < 0.999" in (judge("bfloat16", 0.998).refused or "")
    assert not judge("float32", float("nan")).passed


def test_int8_needs_ndcg_within_the_drop_of_fp32() -> None:
    assert judge("int8", 0.9999, 0.700, 0.703).passed
    refused = judge("int8", 0.9999, 0.700 - MAX_NDCG_DROP - 0.001, 0.700).refused
    assert refused is not None and "nDCG@10" in refused
    assert "no labelled set" in (judge("int8", 0.9999).refused or "")
    assert judge("bfloat16", 0.9999).ndcg is None  # not asked of bf16 and above
