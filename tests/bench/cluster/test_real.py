"""The real-process push-versus-pull comparison: its ratios on made-up runs, how
`flotilla bench cluster` reaches it, and one tiny real run (a random-weight model, the
real nats-server, real `flotilla serve`, gateway, worker and router processes, one worker
a side) that must serve every request both ways without an error."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench import cluster
from bench.cluster import real as cluster_real
from bench.cluster import real_report as cluster_real_report
from bench.cluster import sim as cluster_sim
from bench.services.nats import NatsServer
from tests.gateway.conftest import hub_offline
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

PULL = "pull (JetStream)"
RR = "push rr"
LEAST = "push least R=50ms"


def _run(mode: str, clients: int, tokens_per_s: float, p99_ms: float) -> dict[str, Any]:
    return {
        "mode": mode,
        "side": "pull" if mode == PULL else "push",
        "concurrency": clients,
        "ok": 100,
        "tokens_per_s": tokens_per_s,
        "latency_ms": {"p50": p99_ms / 2, "p99": p99_ms},
    }


def made_up() -> dict[str, Any]:
    runs = [
        _run(PULL, 4, 900.0, 300.0),
        _run(RR, 4, 1000.0, 250.0),
        _run(LEAST, 4, 600.0, 400.0),
        _run(PULL, 16, 1800.0, 900.0),
        _run(RR, 16, 1200.0, 1500.0),
        _run(LEAST, 16, 1500.0, 1100.0),
    ]
    return {
        "modes": [PULL, RR, LEAST],
        "runs": runs,
        "args": {"workers": 2, "threads": 1, "policies": ["rr", "least"]},
        "machine": {"cores": 2},
        "broker": "started by the benchmark",
    }


def test_ratios_at_matched_load_and_at_the_p99_target() -> None:
    summary = cluster_real_report.summarize(made_up(), p99_target_ms=1000.0)
    first, second = summary["levels"]
    assert first["best_push_mode"] == RR and first["ratio_vs_best_push"] == pytest.approx(0.9)
    assert first["ratio_vs"][LEAST] == pytest.approx(1.5)
    assert second["best_push_mode"] == LEAST
    assert second["ratio_vs_best_push"] == pytest.approx(1.2)
    assert summary["matched_load_ratio_vs_best_push_geomean"] == pytest.approx(math.sqrt(0.9 * 1.2))
    # p99 <= 1000 ms: pull meets it at both levels (1800 at 16 clients); push rr meets it
    # at 4 (1000) but not at 16 (1500 ms): 60% of the way in p99, 1000 + 0.6 * 200 = 1120;
    # least: 600 + 6/7 * 900 = 1371.4, the best push.
    at = summary["at_p99_target"]
    assert at[PULL] == {"tokens_per_s": 1800.0, "clients": "16"}
    assert at[RR] == {"tokens_per_s": pytest.approx(1120.0), "clients": "4-16"}
    assert at[LEAST] == {"tokens_per_s": pytest.approx(600 + 900 * 6 / 7), "clients": "4-16"}
    assert summary["at_p99_target_best_push_mode"] == LEAST
    assert summary["at_p99_target_ratio_vs_best_push"] == pytest.approx(1800 / (600 + 900 * 6 / 7))
    # A target nobody meets gives no ratio rather than a made-up one.
    none = cluster_real_report.summarize(made_up(), p99_target_ms=100.0)
    assert none["at_p99_target_ratio_vs_best_push"] is None
    assert set(none["at_p99_target"].values()) == {None}


def test_without_a_target_twice_the_best_light_load_p99_is_the_target() -> None:
    summary = cluster_real_report.summarize(made_up(), p99_target_ms=None)
    assert summary["p99_target_ms"] == 500.0  # 2 x push rr's 250 ms at 4 clients
    assert summary["p99_target_rule"] == "2 x the best p99 at 4 clients"
    at = summary["at_p99_target"]
    assert at[PULL] == {"tokens_per_s": pytest.approx(900 + 900 / 3), "clients": "4-16"}
    assert at[RR] == {"tokens_per_s": pytest.approx(1000 + 200 / 5), "clients": "4-16"}
    assert summary["at_p99_target_ratio_vs_best_push"] == pytest.approx(1200 / 1040)


def test_bench_cluster_runs_the_simulation_unless_told_real(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, list[str]]] = []

    def recorder(name: str) -> Callable[[list[str]], int]:
        def main(argv: list[str]) -> int:
            calls.append((name, argv))
            return 0

        return main

    monkeypatch.setattr(cluster_sim, "main", recorder("sim"))
    monkeypatch.setattr(cluster_real, "main", recorder("real"))
    assert cluster.main(["--quick"]) == 0
    assert cluster.main(["--workers", "3", "--real"]) == 0
    assert calls == [("sim", ["--quick"]), ("real", ["--workers", "3"])]


@pytest.mark.slow
def test_a_tiny_real_run_serves_every_request_both_ways_and_reports_a_ratio(
    nats_server: NatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with hub_offline():
        fleet = tiny_fleet_file(tmp_path, build_tiny_embedder(tmp_path))
    argv = [
        "--nats", nats_server.url, "--fleet", str(fleet), "--workers", "1",
        "--concurrency", "4",
        "--duration-s", "2", "--warmup-s", "0.5", "--policies", "rr,least",
        "--n-texts", "200", "--out-dir", str(tmp_path),
    ]  # fmt: skip
    assert cluster_real.main(argv) == 0
    printed = capsys.readouterr().out
    assert "RATIO pull/push" in printed
    assert (tmp_path / "cluster_real.png").stat().st_size > 0
    data = json.loads((tmp_path / "cluster_real.json").read_text())

    assert data["modes"] == [PULL, RR, LEAST]
    assert data["cosine_push_vs_pull"] > 0.9999
    runs = {r["mode"]: r for r in data["runs"]}
    assert set(runs) == set(data["modes"])
    for mode, run in runs.items():
        assert run["ok"] > 10, (mode, run)
        assert run["errors"] == {}, (mode, run["errors"])
        assert run["token_count_mismatches"] == 0, mode
        assert 0 < run["latency_ms"]["p50"] <= run["latency_ms"]["p99"]
        assert run["tokens_per_s"] > 0 and run["cores"]["client"] > 0
    assert runs[PULL]["router"] is None and runs[PULL]["cores"]["pull workers"] > 0
    for mode in (RR, LEAST):
        router = runs[mode]["router"]
        assert sum(router["requests"]) == runs[mode]["ok"]
        assert router["by_status"] == {"200": runs[mode]["ok"]}
        assert runs[mode]["cores"]["push workers"] > 0
        assert runs[mode]["mean_requests_per_batch"] >= 1
    # One worker a side keeps this under a minute; spreading over several is
    # test_router's (fake workers) and the benchmark's own.
    assert runs[RR]["router"]["requests"] == [runs[RR]["ok"]]
    assert runs[RR]["router"]["polls"] == 0 and runs[LEAST]["router"]["polls"] > 0

    summary = data["summary"]
    (level,) = summary["levels"]
    assert level["concurrency"] == 4
    ratio = level["ratio_vs_best_push"]
    assert ratio == pytest.approx(
        runs[PULL]["tokens_per_s"] / max(runs[RR]["tokens_per_s"], runs[LEAST]["tokens_per_s"])
    )
    assert summary["matched_load_ratio_vs_best_push_geomean"] == pytest.approx(ratio)
    assert summary["notes"]
