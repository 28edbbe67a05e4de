"""The peer comparison's pure parts: loads, the accuracy gate, ratios, the best config."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.peers.compare import (
    Load,
    Measured,
    accuracy_gate,
    best_config,
    comparison_rows,
    parse_loads,
    ratio,
    worst_cosine,
)


def test_parse_loads() -> None:
    assert parse_loads("16x8, 64x1") == [Load(16, 8), Load(64, 1)]
    assert Load(16, 8).name == "16x8"
    for bad in ("", "16", "16x", "ax8", "0x8", "16x0"):
        with pytest.raises(ValueError):
            parse_loads(bad)


def test_the_gate_refuses_a_peer_whose_vectors_are_wrong() -> None:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((6, 384)).astype(np.float32)
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    close = reference + 1e-4 * rng.standard_normal(reference.shape).astype(np.float32)
    assert worst_cosine(close * 3.0, reference) > 0.9999  # scale does not matter
    assert accuracy_gate(worst_cosine(close, reference)) is None
    # one input truncated differently: one row off is enough to refuse
    wrong = close.copy()
    wrong[4] = rng.standard_normal(384).astype(np.float32)
    cosine = worst_cosine(wrong, reference)
    refused = accuracy_gate(cosine)
    assert refused is not None and "do not count" in refused
    assert accuracy_gate(0.9989) is not None and accuracy_gate(0.999) is None
    assert accuracy_gate(float("nan")) is not None


def test_a_shape_mismatch_is_refused() -> None:
    a = np.ones((3, 4), np.float32)
    assert worst_cosine(a[:2], a) == -1.0
    assert accuracy_gate(worst_cosine(np.ones((3, 8), np.float32), a)) is not None


def test_ratio_is_flotilla_over_the_peer() -> None:
    assert ratio(Measured(3000, 10, 20), Measured(1000, 5, 9)) == 3.0
    assert math.isnan(ratio(Measured(3000, 10, 20), Measured(0, 0, 0)))


def test_best_config_is_the_highest_geometric_mean_without_errors() -> None:
    results = {
        "bs16": {"16x8": Measured(1000, 1, 2), "64x1": Measured(4000, 1, 2)},  # geomean 2000
        "bs32": {"16x8": Measured(2100, 1, 2), "64x1": Measured(2100, 1, 2)},  # 2100
        "bs64": {"16x8": Measured(9000, 1, 2, errors=3), "64x1": Measured(9000, 1, 2)},
        "none": {},
    }
    assert best_config(results) == "bs32"
    assert best_config({}) is None


def test_comparison_rows_pair_each_load() -> None:
    loads = [Load(16, 8), Load(64, 1)]
    ours = {"16x8": Measured(3000, 100, 200), "64x1": Measured(2000, 30, 90)}
    theirs = {"16x8": Measured(1500, 150, 400), "64x1": Measured(4000, 20, 50)}
    rows = comparison_rows(ours, theirs, loads)
    assert [r["load"] for r in rows] == ["16x8", "64x1"]
    assert [r["ratio_flotilla_over_peer"] for r in rows] == [2.0, 0.5]
    assert rows[0]["peer_p99_ms"] == 400 and rows[1]["flotilla_p50_ms"] == 30
    assert comparison_rows(ours, {"16x8": theirs["16x8"]}, loads)[0]["load"] == "16x8"
    assert len(comparison_rows(ours, {"16x8": theirs["16x8"]}, loads)) == 1
