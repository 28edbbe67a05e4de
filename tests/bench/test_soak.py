"""bench.soak's pure parts: the traffic mix and the summary's verdicts."""

from __future__ import annotations

import argparse

import pytest

from bench import soak


def test_the_mix_parses_and_bad_kinds_are_refused() -> None:
    assert soak.parse_mix("embed=3,search=1") == {"embed": 3.0, "search": 1.0}
    with pytest.raises(argparse.ArgumentTypeError, match="KIND=WEIGHT"):
        soak.parse_mix("embed=3,translate=1")
    with pytest.raises(argparse.ArgumentTypeError, match="positive"):
        soak.parse_mix("embed=0")


def summary_of(rss: list[tuple[float, int]], samples: list[soak.Sample]) -> dict[str, object]:
    args = soak.parse_args(["--duration-s", "100", "--warmup-s", "20", "--window-s", "50"])
    return soak.summarize(soak.Soak(samples=samples, rss=rss), args)


def test_errors_are_counted_by_route_and_status_and_latency_by_window() -> None:
    samples = [
        soak.Sample(1.0, "embed", 200, 0.010),
        soak.Sample(2.0, "embed", 429, 0.001),
        soak.Sample(60.0, "search", 200, 0.040),
        soak.Sample(61.0, "ingest", 0, 0.5),
    ]
    summary = summary_of([(0.0, 100), (30.0, 200)], samples)
    assert summary["errors_by_route_and_status"] == {
        "embed": {"429": 1}, "rerank": {}, "search": {}, "ingest": {"0": 1}
    }  # fmt: skip
    windows = summary["windows"]
    assert isinstance(windows, list)
    assert [w["from_s"] for w in windows] == [0.0, 50.0]
    assert windows[0]["embed"]["n"] == 1 and windows[1]["search"]["p99_ms"] == pytest.approx(40.0)


def test_memory_is_flat_only_within_the_tolerance_after_warm_up() -> None:
    # Growth during the warm-up does not count; after it, the baseline is the first sample.
    flat = summary_of([(0.0, 100), (10.0, 900), (20.0, 1000), (90.0, 1090)], [])
    assert flat["memory_flat"] is True
    grows = summary_of([(0.0, 100), (20.0, 1000), (90.0, 1200)], [])
    assert grows["memory_flat"] is False
    assert grows["rss_after_warmup_growth"] == pytest.approx(0.2)
