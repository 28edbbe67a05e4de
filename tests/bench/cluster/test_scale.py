"""The cluster-scale run's pure parts: devices and their env, hosting, busy fractions,
the workloads' requests and the summary. No processes start here."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from bench.cluster import scale_report
from bench.cluster.cost_model import FALLBACK
from bench.cluster.emulation import (
    Device,
    busy_fractions,
    device_cost,
    fleet_file,
    forward_seconds,
    hosting_map,
    hosts_of,
    knee_tokens,
    slowdowns,
)
from bench.cluster.router import Router
from bench.cluster.scale_load import build, cluster_rate, text_of


def test_a_quarter_of_the_devices_are_three_times_slower() -> None:
    assert slowdowns(16, 0.25, 3.0) == [1.0] * 12 + [3.0] * 4
    assert slowdowns(4) == [1.0] * 4
    with pytest.raises(ValueError):
        slowdowns(4, 1.5)


def test_a_device_tells_its_worker_the_fit_in_milliseconds() -> None:
    env = Device(FALLBACK, 3.0).env()
    assert float(env["FLOTILLA_EMULATED_FIXED_MS"]) == pytest.approx(1e3 * FALLBACK.fixed_s)
    assert float(env["FLOTILLA_EMULATED_MS_PER_1K_TOKENS"]) == pytest.approx(
        1e6 * FALLBACK.per_token_s
    )
    assert env["FLOTILLA_EMULATED_SLOWDOWN"] == "3"
    assert Device(FALLBACK, 3.0).batch_s([20]) == pytest.approx(3 * FALLBACK.batch_s([20]))


def test_a_device_batches_up_to_where_its_fixed_cost_is_amortized() -> None:
    # 90% of the per-token peak: fixed / (fixed + per_token * t) <= 10%.
    t = knee_tokens(FALLBACK)
    assert t % 64 == 0
    assert FALLBACK.per_token_s * t / FALLBACK.batch_s([t]) >= 0.9
    assert FALLBACK.per_token_s * (t - 64) / FALLBACK.batch_s([t - 64]) < 0.9
    slow = device_cost("cpu", 10.0)
    assert slow.max_batch_tokens == device_cost("cpu").max_batch_tokens  # scale cancels out
    assert slow.fixed_s == pytest.approx(10 * device_cost("cpu").fixed_s)


def test_the_emulated_fleet_carries_the_devices_limits_in_its_time(tmp_path: Path) -> None:
    import yaml

    from embedder.tasks.fleet import load_fleet

    cost = device_cost("cpu", 4.0)
    spec = load_fleet().get("all-minilm-l6-v2")
    path = fleet_file(spec, ["m0", "m1"], tmp_path / "fleet.yaml", cost)
    fleet = load_fleet(path)
    cpu = fleet.get("m1").profile("cpu")
    assert (cpu.runtime, cpu.max_batch_tokens, cpu.forward_tokens) == (
        "emulated",
        cost.max_batch_tokens,
        cost.forward_tokens,
    )
    assert cpu.max_wait_ms == pytest.approx(4 * 1e3 * FALLBACK.max_wait_s)
    target = spec.profile("cpu").latency_target_ms
    assert cpu.latency_target_ms == (None if target is None else pytest.approx(4 * target))
    assert "&" not in path.read_text()  # plain copies, no YAML anchors
    assert set(yaml.safe_load(path.read_text())["models"]) == {"m0", "m1"}


def test_every_model_is_hosted_by_as_many_workers_and_the_router_knows_them() -> None:
    hosting = hosting_map(16, ["m0", "m1", "m2", "m3"], 2)
    assert all(len(set(models)) == 2 for models in hosting.values())
    hosts = hosts_of(hosting)
    assert {m: len(ws) for m, ws in hosts.items()} == {"m0": 8, "m1": 8, "m2": 8, "m3": 8}
    router = Router([f"http://w{i}" for i in range(16)], "rr", 50, hosting=hosts)
    picks = {router.place(10, "m2") for _ in range(40)}
    assert picks == set(hosts["m2"])  # round-robin over the model's hosts, no other
    least = Router([f"http://w{i}" for i in range(16)], "least+own", 50, hosting=hosts)
    assert all(least.place(10, "m1") in hosts["m1"] for _ in range(40))
    with pytest.raises(ValueError):
        Router(["http://w0"], "rr", 50, hosting={"m0": [3]})


def test_busy_fraction_is_time_in_forward_over_wall_time() -> None:
    text = (
        'flotilla_inference_seconds_sum{model="m0"} 1.5\n'
        'flotilla_inference_seconds_sum{model="m1"} 0.5\n'
        'flotilla_inference_seconds_count{model="m0"} 9\n'
    )
    assert forward_seconds(text) == 2.0
    assert busy_fractions([2.0, 1.0, 0.0], [4.0, 1.5, 9.0], 4.0) == [0.5, 0.125, 1.0]
    with pytest.raises(ValueError):
        busy_fractions([0.0], [1.0], 0.0)


def test_workload_requests_carry_their_models_and_sizes() -> None:
    requests = build("multimodel", 400, FALLBACK, 7)
    body = json.loads(requests.bodies[0])
    assert body["model"] == requests.models[0] and 1 <= len(body["input"]) <= 3
    assert set(requests.models) == {"m0", "m1", "m2", "m3"}
    assert build("multimodel", 400, FALLBACK, 7).bodies == requests.bodies  # seeded
    assert len(text_of(10, 3).split()) == 8  # [CLS] and [SEP] make the other two tokens
    slow = cluster_rate(requests.workload, FALLBACK, [1.0, 3.0])
    assert slow == pytest.approx(cluster_rate(requests.workload, FALLBACK, [1.0]) * 4 / 3)
    times = build("bursty", 400, FALLBACK, 7).arrivals(100.0)
    assert all(b >= a for a, b in itertools.pairwise(times))


def _run(workload: str, mode: str, load: float, tps: float, p99: float) -> dict[str, Any]:
    return {
        "workload": workload, "mode": mode, "load": load, "tokens_per_s": tps, "sent": 100,
        "ok": 100, "error_share": 0.0, "latency_ms": {"p99": p99}, "busy": [0.5, 0.7],
        "cores": {"client": 0.2, "router": 0.1, "workers": 0.5},
    }  # fmt: skip


def test_the_summary_takes_the_best_run_within_the_target_and_the_ratios() -> None:
    data = {
        "device": {"scale": 10.0, "label": "cpu"},
        "workloads": {"small": {"single_request_s": 0.1}},
        "runs": [
            _run("small", "pull (jetstream)", 0.5, 1000, 300),
            _run("small", "pull (jetstream)", 1.0, 2000, 900),
            _run("small", "push rr", 0.5, 1000, 500),
            _run("small", "push rr", 1.0, 1900, 5000),  # over the 1 s target
        ],
    }
    s = scale_report.summarize(data)
    w = s["small"]
    assert w["p99_target_ms"] == pytest.approx(1000.0)
    assert w["modes"]["pull (jetstream)"]["tokens_per_s_at_target"] == 2000
    assert w["modes"]["push rr"]["tokens_per_s_at_target"] == 1000
    assert w["pull_over_push"]["push rr"] == pytest.approx(2.0)
    assert w["pull_over_best_push"] == pytest.approx(2.0)
    assert w["modes"]["push rr"]["busy_mean"] == pytest.approx(0.6)
    assert s["host_path"]["worst_cores"] == pytest.approx(0.3)
    data["summary"] = s
    assert "pull / best push: 2.00" in scale_report.tables(data)
