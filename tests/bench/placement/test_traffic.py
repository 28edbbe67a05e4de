"""The placement benchmark's traffic: arrivals at the rate asked, popularity by Zipf
reshuffled per phase, and the wait for a host measured from the first request a model
without one got to the gateway seeing it ready."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.placement import run
from bench.placement.traffic import Measured, schedule, zipf_weights

MODELS = [f"m{i}" for i in range(8)]


def test_zipf_weights_fall_with_rank_and_sum_to_one() -> None:
    weights = zipf_weights(8, 1.2)
    assert sum(weights) == pytest.approx(1.0)
    assert weights == sorted(weights, reverse=True)


def test_arrivals_keep_the_rate_and_the_favourite_changes_between_phases() -> None:
    plan = schedule(MODELS, rate=20.0, phases=4, phase_s=50.0, s=1.2, seed=3)
    assert len(plan) == pytest.approx(20.0 * 200, rel=0.1)
    assert [at for at, _ in plan] == sorted(at for at, _ in plan)
    favourites = []
    for phase in range(4):
        counts = Counter(m for at, m in plan if phase * 50 <= at < (phase + 1) * 50)
        favourites.append(counts.most_common(1)[0][0])
    assert len(set(favourites)) > 1
    assert schedule(MODELS, 20.0, 4, 50.0, 1.2, seed=3) == plan  # seeded


def test_a_host_wait_runs_from_the_first_request_without_a_host_to_ready() -> None:
    measured = Measured()
    measured.saw({"a": "evicted", "b": "ready"}, 0.0)
    measured.sent("b", 0.5)  # served already: no wait
    measured.sent("a", 1.0)
    measured.sent("a", 1.5)  # the same wait
    measured.saw({"a": "loading", "b": "ready"}, 2.0)
    measured.saw({"a": "ready", "b": "ready"}, 4.0)
    assert measured.host_waits_s == [3.0]
    assert measured.summary()["host_wait_s"] == {"episodes": 1, "p50": 3.0, "max": 3.0}


def test_models_must_be_twice_the_workers_for_the_fixed_setup() -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--workers", "4", "--models", "6"])
    args = run.parse_args(["--quick"])
    assert (args.phases, args.phase_s) == (2, 20.0)
