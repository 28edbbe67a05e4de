"""The paired comparison: its interval against a closed form, its per-law groups."""

from __future__ import annotations

import numpy as np
import pytest

from lora.compare import compare, describe, paired_bootstrap


def test_bootstrap_interval_matches_the_normal_approximation() -> None:
    rng = np.random.default_rng(1)
    base = rng.uniform(0, 1, 2000)
    system = base + rng.normal(0.05, 0.2, 2000)
    low, high = paired_bootstrap(list(base), list(system), resamples=4000, seed=3)
    diffs = system - base
    centre, half = diffs.mean(), 1.96 * diffs.std(ddof=1) / np.sqrt(diffs.size)
    assert low == pytest.approx(centre - half, abs=0.003)
    assert high == pytest.approx(centre + half, abs=0.003)


def test_pairing_narrows_the_interval_when_scores_move_together() -> None:
    rng = np.random.default_rng(2)
    base = rng.uniform(0, 1, 500)
    low, high = paired_bootstrap(list(base), list(base + 0.01), resamples=500)
    # every query gains exactly 0.01: no spread at all, though the scores spread widely
    assert low == pytest.approx(0.01) and high == pytest.approx(0.01)


def test_an_empty_comparison_is_refused() -> None:
    with pytest.raises(ValueError, match="no queries"):
        paired_bootstrap([], [])


def test_compare_counts_better_and_worse_and_groups_queries_by_law() -> None:
    qrels = {
        "q1": {"bgb/§1": 1},
        "q2": {"bgb/§2": 1, "hgb/§9": 1},  # a heading in two laws counts for both
        "q3": {"hgb/§3": 1},
        "q4": {"hgb/§4": 0},  # judged, none relevant: no law
    }
    base = {q: {"ndcg@10": v} for q, v in {"q1": 0.5, "q2": 0.5, "q3": 1.0, "q4": 0.0}.items()}
    system = {q: {"ndcg@10": v} for q, v in {"q1": 1.0, "q2": 0.5, "q3": 0.5, "q4": 0.0}.items()}
    c = compare(("base", base), ("lora", system), qrels, resamples=200)
    assert (c.overall.queries, c.overall.better, c.overall.worse) == (4, 1, 1)
    assert c.overall.delta == pytest.approx(0.0)
    assert set(c.per_law) == {"bgb", "hgb"}
    assert (c.per_law["bgb"].queries, c.per_law["bgb"].better) == (2, 1)
    assert c.per_law["bgb"].relative == pytest.approx(0.5)  # 0.5 -> 0.75
    assert (c.per_law["hgb"].queries, c.per_law["hgb"].worse) == (2, 1)
    text = describe(c)
    assert "lora against base" in text and "hgb" in text
    assert c.as_dict()["per_law"]["bgb"]["relative"] == pytest.approx(0.5)
