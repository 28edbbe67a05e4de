"""The cluster-scale run's pure parts: devices and their env, hosting, busy fractions,
the workloads' requests and their traffic (deadlines, popularity, bursts, entry points),
the bisection and the summary. No processes start here."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.cluster import scale_report
from bench.cluster import scale_traffic as traffic
from bench.cluster.cost_model import FALLBACK
from bench.cluster.emulation import (
    Device,
    busy_fractions,
    device_cost,
    fleet_file,
    forward_seconds,
    generations,
    hosting_map,
    hosts_of,
    knee_tokens,
)
from bench.cluster.router import Router
from bench.cluster.scale import devices_for, parse_args
from bench.cluster.scale_load import MANY_MODELS, build, cluster_rate, text_of
from bench.cluster.scale_runs import Mode, rotated
from bench.cluster.scale_search import Bisection, meets_target
from bench.services.nats import NatsServer
from embedder.queue.jetstream.config import JetStreamConfig


def test_three_device_generations_by_share_spread_over_the_workers() -> None:
    fleet = generations(10)
    assert sorted(fleet) == [1.0] * 5 + [2.0] * 3 + [4.0] * 2
    assert generations(16).count(1.0) == 8 and generations(16).count(4.0) == 3
    # No run of neighbours is one generation only: a model's consecutive hosts mix them.
    assert all(len(set(fleet[i : i + 4])) > 1 for i in range(len(fleet) - 3))
    assert generations(3, [(1.0, 1.0)]) == [1.0] * 3
    with pytest.raises(ValueError):
        generations(4, [(1.0, 0.5), (2.0, 0.2)])


def test_the_hetero_workload_runs_on_generations_and_manymodels_on_subsets() -> None:
    hetero = devices_for("hetero", 8, FALLBACK)
    assert sorted(d.slowdown for d in hetero.devices) == [1.0] * 4 + [2.0] * 2 + [4.0] * 2
    assert not hetero.subsets and hetero.models == ("m0",)
    many = devices_for("manymodels", 8, FALLBACK)
    assert many.subsets and len(many.models) == 16 and many.models == MANY_MODELS
    assert all(2 <= len(ms) <= 4 for ms in many.hosting.values())
    assert set(hosts_of(many.hosting)) == set(MANY_MODELS)  # every model has a host


def test_a_fixed_cost_gpu_spends_most_of_a_batch_in_the_fixed_part() -> None:
    gpu = device_cost("gpu-fixed")
    assert gpu.source == "hypothetical"
    full = [gpu.max_batch_tokens // gpu.max_batch_requests] * gpu.max_batch_requests
    assert gpu.fixed_s / gpu.batch_s(full) > 0.5  # even a full batch
    assert gpu.fixed_s / gpu.batch_s([24] * 4) > 0.9  # a typical half-full one
    assert parse_args([]).device == "gpu-fixed" and parse_args([]).workers == 8
    assert parse_args(["--device", "cpu"]).workers == 16


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

    from embedder.core.fleet import entry_as
    from embedder.tasks.embed.spec import EncoderSpec
    from embedder.tasks.fleet import load_fleet

    cost = device_cost("cpu", 4.0)
    spec = entry_as(load_fleet().get("all-minilm-l6-v2"), EncoderSpec)
    path = fleet_file(spec, ["m0", "m1"], tmp_path / "fleet.yaml", cost)
    fleet = load_fleet(path)
    cpu = entry_as(fleet.get("m1"), EncoderSpec).profile("cpu")
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


def test_hosting_sizes_deal_the_models_out_in_turn() -> None:
    models = [f"m{i}" for i in range(6)]
    hosting = hosting_map(4, models, [2, 3])
    assert hosting == {0: ["m0", "m1"], 1: ["m2", "m3", "m4"], 2: ["m5", "m0"],
                       3: ["m1", "m2", "m3"]}  # fmt: skip
    with pytest.raises(ValueError):
        hosting_map(4, models, [0, 2])


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


def test_workload_requests_carry_their_models_sizes_and_deadlines() -> None:
    requests = build("manymodels", 400, FALLBACK, 7)
    sends = requests.sends(100.0, 2.0, 1000.0, 1)
    body = json.loads(sends[0].body)
    assert body["model"] in MANY_MODELS and 1 <= len(body["input"]) <= 3
    assert {json.loads(s.body)["model"] for s in sends} <= set(MANY_MODELS)
    assert all(s.at_s < 2.0 and s.entry == 0 for s in sends)
    assert {s.deadline_ms for s in sends} == {1000.0, 2000.0, 4000.0}
    assert build("manymodels", 400, FALLBACK, 7).sends(100.0, 2.0, 1000.0, 1) == sends  # seeded
    assert len(text_of(10, 3).split()) == 8  # [CLS] and [SEP] make the other two tokens
    slow = cluster_rate(requests.workload, FALLBACK, [1.0, 2.0])
    assert slow == pytest.approx(cluster_rate(requests.workload, FALLBACK, [1.0]) * 3 / 2)
    times = build("bursty", 400, FALLBACK, 7, burst_s=0.1).arrivals(100.0)
    assert all(b >= a for a, b in itertools.pairwise(times))
    assert {json.loads(s.body)["model"] for s in build("small", 50, FALLBACK, 1).sends(
        100.0, 1.0, 1000.0, 1)} == {"m0"}  # fmt: skip


def test_latency_classes_come_in_their_shares_with_deadlines_in_targets() -> None:
    classes = traffic.latency_classes(20_000, 3)
    shares = [classes.count(i) / len(classes) for i in range(len(traffic.LATENCY_CLASSES))]
    assert shares == pytest.approx([c.share for c in traffic.LATENCY_CLASSES], abs=0.02)
    interactive = traffic.LATENCY_CLASSES[0]
    assert traffic.deadline_ms(interactive, 750.0) == 750.0  # the target itself
    assert all(c.of_target >= 1 for c in traffic.LATENCY_CLASSES)


def test_the_popularity_ranking_rotates_every_shift() -> None:
    shares = traffic.zipf_shares(16)
    assert shares.sum() == pytest.approx(1.0) and shares[0] == pytest.approx(2 * shares[1])
    ranks = traffic.zipf_ranks(5000, 16, 1)
    assert max(set(ranks), key=ranks.count) == 0
    models = traffic.shifted_models([0, 0, 0, 3], [0.5, 10.5, 21.0, 21.0], 16, 10.0)
    step = traffic.ROTATE_STEP
    assert models == [0, step, 2 * step, (3 + 2 * step) % 16]
    assert traffic.shifted_models([0, 17], [99.0, 99.0], 16, 0.0) == [0, 1]  # never shifts
    # Over 16 shifts the top rank visits every model once.
    assert len(set(traffic.shifted_models([0] * 16, [float(e) for e in range(16)], 16, 1.0))) == 16


def test_bursts_are_sharp_short_and_keep_the_mean_rate() -> None:
    unit = np.cumsum(np.random.default_rng(0).exponential(1.0, 200_000))
    rate, burst_s = 50.0, 0.4
    times = traffic.burst_times(unit, rate, burst_s)
    assert len(times) / times[-1] == pytest.approx(rate, rel=0.02)
    quiet_s = burst_s * (traffic.BURST_FACTOR - 1) / (1 - traffic.QUIET_SHARE)
    phase = np.mod(times, quiet_s + burst_s)
    in_burst = phase >= quiet_s
    observed = in_burst.sum() / (len(times) / rate) / (burst_s / (quiet_s + burst_s))
    assert observed / rate == pytest.approx(traffic.BURST_FACTOR, rel=0.05)
    assert 5 <= traffic.BURST_FACTOR <= 10 and traffic.BURST_OF_TARGET < 1
    assert np.all(np.diff(times) >= 0)
    with pytest.raises(ValueError):
        traffic.burst_times(unit, rate, 0.0)


def test_requests_spread_over_the_entry_points_by_seed() -> None:
    entries = traffic.entry_points(8000, 4, 5)
    assert set(entries) == {0, 1, 2, 3}
    assert min(entries.count(k) for k in range(4)) > 1800
    assert traffic.entry_points(8000, 4, 5) == entries and traffic.entry_points(9, 1, 5) == [0] * 9
    sends = build("small", 400, FALLBACK, 7).sends(200.0, 1.0, 500.0, 4)
    assert {s.entry for s in sends} == {0, 1, 2, 3}


def test_the_bisection_halves_toward_the_highest_load_that_met() -> None:
    search = Bisection(0.1, 1.5)
    assert search.load == pytest.approx(0.8)
    search.record(True)
    assert search.load == pytest.approx(1.15)
    search.record(False)
    assert search.load == pytest.approx(0.975)
    search.record(True)
    assert search.best == pytest.approx(0.975)
    assert [m for _, m in search.tried] == [True, False, True]
    never = Bisection()
    for _ in range(4):
        never.record(False)
    assert never.best is None and never.load < 0.2
    with pytest.raises(ValueError):
        Bisection(1.0, 0.5)


def test_pull_gets_a_deadline_lane_per_latency_class() -> None:
    bounds = traffic.lane_bounds_ms(1000.0)
    assert bounds == [1414, 2828]  # between 1x, 2x and 4x the target
    config = JetStreamConfig.model_validate({"nats_deadline_lanes_ms": bounds})
    assert [config.lane_of("m", c.of_target).index for c in traffic.LATENCY_CLASSES] == [0, 1, 2]
    assert parse_args([]).lanes == "deadline" and parse_args(["--lanes", "none"]).lanes == "none"


def test_the_bisection_searches_the_bracket_asked_for() -> None:
    assert parse_args([]).loads == (0.1, 1.5)
    narrow = parse_args(["--loads", "0.1-0.5"]).loads
    assert narrow == (0.1, 0.5) and Bisection(*narrow).load == pytest.approx(0.3)
    for wrong in ("0.5-0.1", "0-0.5", "0.5", "a-b"):
        with pytest.raises(SystemExit):
            parse_args(["--loads", wrong])


OF_TARGET = {"interactive": 1.0, "batch": 4.0}
CLASSES = [{"name": n, "share": 0.5, "of_target": t} for n, t in OF_TARGET.items()]


def test_a_load_meets_the_target_on_each_class_median_p99_and_pooled_errors() -> None:
    def at(p99: float, batch: float | None = None, ok: int = 100) -> dict[str, Any]:
        by_class = {"interactive": p99, "batch": p99 if batch is None else batch}
        return {"sent": 100, "ok": ok, "latency_ms": {"p99": p99}, "p99_ms_by_class": by_class}

    def met(*runs: dict[str, Any]) -> bool:
        return meets_target(runs, 1000, OF_TARGET)

    assert met(at(900), at(1100), at(950))  # one slow seed of three
    assert not met(at(900), at(1100), at(1050))
    assert met(at(900, batch=3500))  # batch work deferred within its own deadline
    assert not met(at(900, batch=4500), at(900, batch=4100))
    no_batch = at(900) | {"p99_ms_by_class": {"interactive": 900, "batch": None}}
    assert met(no_batch)  # no batch request answered: its failures count as errors
    assert not met(at(500, ok=98))  # 2% errors (504s count)
    assert met(at(500, ok=99), at(500))
    assert not met()


def test_modes_take_turns_leading() -> None:
    modes = [Mode("pull"), Mode("push rr", "rr"), Mode("push least+own", "least+own", 50)]
    orders = [[m.name for m in rotated(modes, turn)] for turn in range(3)]
    assert [o[0] for o in orders] == ["pull", "push rr", "push least+own"]
    assert all(sorted(o) == sorted(m.name for m in modes) for o in orders)


def test_quick_is_one_seed_one_k_two_policies() -> None:
    args = parse_args(["--quick"])
    assert (args.seeds, args.gateways, args.policies) == (1, [1], ["rr", "least+own"])
    assert args.steps <= 2 and args.duration_s < 60
    full = parse_args(["--gateways", "1,4,8"])
    assert full.gateways == [1, 4, 8] and full.seeds >= 3 and full.duration_s >= 60


def _run(
    workload: str, mode: str, load: float, tps: float, p99: float, k: int = 1, seed: int = 1
) -> dict[str, Any]:
    return {
        "workload": workload, "mode": mode, "load": load, "tokens_per_s": tps, "sent": 100,
        "ok": 100, "error_share": 0.0, "latency_ms": {"p99": p99}, "busy": [0.5, 0.7],
        "p99_ms_by_class": {"interactive": p99, "batch": p99},
        "cores": {"client": 0.2, "router": 0.1, "workers": 0.5}, "gateways": k, "seed": seed,
    }  # fmt: skip


def test_the_summary_takes_the_highest_load_within_the_target_per_k_and_the_ratios() -> None:
    data = {
        "device": {"scale": 10.0, "label": "cpu"},
        "latency_classes": CLASSES,
        "workloads": {"small": {"single_request_s": 0.1}},
        "runs": [
            _run("small", "pull (jetstream)", 0.5, 1000, 300),
            _run("small", "pull (jetstream)", 1.0, 2000, 900),
            _run("small", "pull (jetstream)", 1.0, 2200, 950, seed=2),
            _run("small", "push rr", 0.5, 1000, 500),
            _run("small", "push rr", 1.0, 1900, 5000),  # over the 1 s target
            _run("small", "pull (jetstream)", 0.5, 900, 300, k=4),
            _run("small", "push rr", 0.5, 1200, 300, k=4),
        ],
    }
    s = scale_report.summarize(data)
    w = s["small"]
    assert w["p99_target_ms"] == pytest.approx(1000.0)
    one = w["by_gateways"]["1"]
    assert one["modes"]["pull (jetstream)"]["load"] == 1.0
    assert one["modes"]["pull (jetstream)"]["tokens_per_s_at_target"] == pytest.approx(2100)
    assert one["modes"]["push rr"]["tokens_per_s_at_target"] == 1000
    assert one["pull_over_push"]["push rr"] == pytest.approx(2.1)
    assert one["pull_over_best_push"] == pytest.approx(2.1)
    assert one["modes"]["push rr"]["busy_mean"] == pytest.approx(0.6)
    assert w["by_gateways"]["4"]["pull_over_best_push"] == pytest.approx(0.75)
    assert s["host_path"]["worst_cores"] == pytest.approx(0.3)
    data["summary"] = s
    printed = scale_report.tables(data)
    assert "pull / best push: 2.10" in printed and "K=4" in printed
    beside = scale_report.beside_simulated(s, {"small": {"pull": 1.2, "push": {"4": {"rr": 0.4}}}})
    assert (
        "K=1   pull real  1.00  simulated  1.20   best push real  0.50  simulated   n/a" in beside
    )
    assert "K=4   pull real" in beside and "simulated  0.40" in beside
    assert "not simulated" in scale_report.beside_simulated(s)


def test_the_chart_is_drawn_per_workload_and_k(tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "device": {"scale": 1.0, "label": "cpu"},
        "latency_classes": CLASSES,
        "workloads": {"small": {"single_request_s": 0.1}},
        "runs": [
            _run("small", "pull (jetstream)", 0.5, 1000, 300),
            _run("small", "push rr", 0.5, 900, 300, k=4),
        ],
    }
    data["summary"] = scale_report.summarize(data)
    scale_report.plot(data, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").stat().st_size > 0


def test_a_saved_run_is_summarized_again_beside_the_simulation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.cluster import scale

    saved = {
        "device": {"scale": 1.0, "label": "cpu"},
        "latency_classes": CLASSES,
        "workloads": {"hetero": {"single_request_s": 0.1, "p99_target_ms": 1000.0}},
        "runs": [_run("hetero", "pull (jetstream)", 0.8, 1000, 800, k=4)],
    }
    (tmp_path / "saved.json").write_text(json.dumps(saved))
    (tmp_path / "sim.json").write_text(json.dumps({"hetero": {"pull": 0.95}}))
    argv = ["--summarize", str(tmp_path / "saved.json"), "--simulated", str(tmp_path / "sim.json"),
            "--out-dir", str(tmp_path)]  # fmt: skip
    assert scale.main(argv) == 0
    assert "hetero     K=4   pull real  0.80  simulated  0.95" in capsys.readouterr().out


@pytest.mark.slow
def test_a_tiny_run_at_scale_serves_both_ways_through_two_entry_points(
    nats_server: NatsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.cluster import scale

    argv = [
        "--nats", nats_server.url, "--workers", "2", "--workloads", "hetero",
        "--gateways", "2", "--policies", "rr,least+own", "--duration-s", "2",
        "--steps", "1", "--seeds", "1", "--out-dir", str(tmp_path),
    ]  # fmt: skip
    assert scale.main(argv) == 0
    assert "pull / best push" in capsys.readouterr().out
    data = json.loads((tmp_path / "cluster_scale.json").read_text())
    assert (tmp_path / "cluster_scale.png").stat().st_size > 0
    runs = data["runs"]
    assert {r["mode"] for r in runs} == {"pull (jetstream)", "push rr", "push least+own R=50ms"}
    for run in runs:
        assert run["gateways"] == 2 and run["ok"] > 0, run
        assert run["load"] == pytest.approx(0.8) and len(run["busy"]) == 2
    assert data["summary"]["hetero"]["by_gateways"]["2"]["modes"]


def test_the_run_s_fleet_is_simulated_beside_it() -> None:
    """The simulation gets the run's fleet: its slowdowns, hosting (names to indices),
    p99 target, K routers and wall refresh; on devices 1x and 4x the paced ideal pull
    reaches a higher load than round-robin, which ignores speed."""
    from bench.cluster.scale_ideal import simulate_run

    data = {
        "args": {"device": "cpu", "seed": 7, "gateways": [2], "policies": ["rr"]},
        "device": {"scale": 1.0, "refresh_ms_wall": [50.0]},
        "workloads": {
            "hetero": {
                "n_requests": 3000,
                "models": ["m0"],
                "slowdowns": [1.0, 4.0],
                "hosting": {"0": ["m0"], "1": ["m0"]},
                "p99_target_ms": 400.0,
            }
        },
    }
    result = simulate_run(data)["hetero"]
    rr = result["push"]["2"]["rr R=50ms"]
    assert result["pull"] > rr
    assert result["approximated"] is None
