"""bench.hostpath's own arithmetic: the fleet it serves and what each level reports."""

from __future__ import annotations

import pytest

from bench import hostpath, served
from embedder.tasks.fleet import load_fleet


def test_every_profile_of_the_served_model_runs_on_the_emulated_device() -> None:
    spec = load_fleet().get("all-minilm-l6-v2")
    moved = hostpath.emulated(spec)
    assert {p.runtime for p in moved.profiles.values()} == {"emulated"}
    for kind, profile in moved.profiles.items():  # batch limits unchanged
        assert profile.model_copy(update={"runtime": "torch"}) == spec.profiles[kind]


def test_a_level_reports_rates_per_core_and_the_cores_a_1m_device_needs() -> None:
    level = served.Level(concurrency=4, elapsed_s=2.0, sent=10, ok=8, tokens=400_000)
    row = hostpath.level_row(level, inputs_sent=50, server_cpu_s=1.0)
    assert row["requests_per_s"] == 4.0
    assert row["inputs_per_s"] == pytest.approx(50 * 0.8 / 2.0)  # failed requests carry none
    assert row["tokens_per_s"] == 200_000
    assert row["server_cores_busy"] == 0.5
    assert row["tokens_per_s_per_server_core"] == 400_000
    assert row["server_cores_for_1m_tokens_per_s"] == 2.5
    assert [name for name, _ in hostpath.COLUMNS][:3] == ["clients", "ok", "errors"]
