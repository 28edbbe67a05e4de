"""Retrieval metrics against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from lora.metrics import evaluate, mrr_at_k, ndcg_at_k, per_query, recall_at_k


def test_ndcg_of_one_relevant_document_at_rank_three() -> None:
    # DCG = 1/log2(4) = 0.5; the ideal puts it first: 1/log2(2) = 1.
    assert ndcg_at_k(["a", "b", "rel", "c"], {"rel": 1}, 10) == pytest.approx(0.5)


def test_ndcg_of_two_relevant_documents() -> None:
    # relevant at ranks 1 and 3: DCG = 1 + 1/log2(4) = 1.5;
    # ideal at ranks 1 and 2: 1 + 1/log2(3) = 1.6309...
    expected = 1.5 / (1 + 1 / math.log2(3))
    assert ndcg_at_k(["r1", "x", "r2"], {"r1": 1, "r2": 1}, 10) == pytest.approx(expected)
    assert expected == pytest.approx(0.91972, abs=1e-5)


def test_ndcg_with_grades_uses_linear_gain() -> None:
    # ranked: grade 1 then grade 2. DCG = 1 + 2/log2(3); ideal: 2 + 1/log2(3).
    expected = (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert ndcg_at_k(["g1", "g2"], {"g1": 1, "g2": 2}, 10) == pytest.approx(expected)


def test_ndcg_cuts_at_k_on_both_sides() -> None:
    judged = {f"r{i}": 1 for i in range(12)}
    assert ndcg_at_k([f"r{i}" for i in range(12)], judged, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["x"] * 10 + ["r0"], {"r0": 1}, 10) == 0.0


def test_unjudged_and_non_relevant_documents_gain_nothing() -> None:
    assert ndcg_at_k(["zero", "rel"], {"zero": 0, "rel": 1}, 10) == pytest.approx(1 / math.log2(3))
    assert mrr_at_k(["zero", "rel"], {"zero": 0, "rel": 1}, 10) == 0.5


def test_recall_counts_all_relevant_documents_not_capped_at_k() -> None:
    judged = {"a": 1, "b": 1, "c": 1, "d": 1}
    assert recall_at_k(["a", "x", "c"], judged, 10) == 0.5
    assert recall_at_k(["a", "b", "c"], judged, 2) == 0.5  # BEIR: 2 of 4, not 2 of 2


def test_mrr_is_the_first_relevant_rank_within_k() -> None:
    assert mrr_at_k(["x", "y", "r", "r2"], {"r": 1, "r2": 1}, 10) == pytest.approx(1 / 3)
    assert mrr_at_k(["x"] * 10 + ["r"], {"r": 1}, 10) == 0.0


def test_the_mean_over_judged_queries() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 0}}  # q3: nothing relevant, skipped
    run = {"q1": ["a"], "q2": ["x", "b"]}  # also a query the run left out would score 0
    scores = per_query(run, qrels)
    assert set(scores) == {"q1", "q2"}
    means = evaluate(run, qrels)
    assert means["mrr@10"] == pytest.approx((1 + 0.5) / 2)
    assert means["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3)) / 2)
    assert means["recall@10"] == 1.0 and means["recall@100"] == 1.0
    assert evaluate({}, qrels)["ndcg@10"] == 0.0
