"""The push-versus-pull simulator's mechanics, with a fixed cost model (no real model)."""

from __future__ import annotations

import json
import math
import random
from collections import Counter, deque
from pathlib import Path

import pytest

from bench.cluster.calibrate import fit_line
from bench.cluster.cost_model import CostModel, padded_tokens
from bench.cluster.deadlines import fill_in_time
from bench.cluster.emulation import hosting_map
from bench.cluster.engine import BatchLog, SimResult, simulate
from bench.cluster.experiments import ideal_max_load, max_load, with_models
from bench.cluster.fleet import (
    hosting_indices,
    paced_budget,
    per_worker_counts,
    popular_hosting,
    profile_slowdowns,
    zipf_shares,
)
from bench.cluster.policies import POLICIES, PUSH, SimRouter
from bench.cluster.sim import main
from bench.cluster.workloads import Workload, capacity, make_workload
from embedder.tasks.embed.batching import micro_batches

COST = CostModel(
    label="test: fixed",
    source="fixed",
    fixed_s=0.004,
    per_token_s=2e-5,
    max_batch_tokens=4096,
    max_batch_requests=64,
    max_wait_s=0.002,
    forward_tokens=2048,
    forward_max_sequences=64,
)


@pytest.fixture(scope="module")
def small() -> Workload:
    return make_workload("small", 12_000, COST)


def arrivals(workload: Workload, workers: int, load: float) -> list[float]:
    return workload.arrivals(load * workers * capacity(workload, COST).requests_per_s)


@pytest.mark.parametrize("name", ["small", "mixed", "bursty", "multimodel"])
@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_completes_exactly_once_under_the_batching_rule(
    name: str, policy: str
) -> None:
    workload = make_workload(name, 3_000, COST)
    log: list[BatchLog] = []
    result = simulate(workload, COST, workers=4, policy=policy, load=0.7, staleness_s=0.02, log=log)
    assert not result.aborted
    served = Counter(i for batch in log for i in batch.requests)
    assert served == Counter(range(len(workload)))
    times = arrivals(workload, 4, 0.7)
    ends: dict[int, float] = {}
    for batch in sorted(log, key=lambda b: b.start):
        assert batch.start >= ends.get(batch.worker, 0.0)  # one batch at a time
        ends[batch.worker] = batch.end
        assert all(times[i] <= batch.start for i in batch.requests)
        assert {workload.models[i] for i in batch.requests} == {batch.model}
        assert len(batch.requests) <= COST.max_batch_requests
        tokens = sum(workload.tokens[i] for i in batch.requests)
        assert tokens <= COST.max_batch_tokens or len(batch.requests) == 1
        lengths = [n for i in batch.requests for n in workload.lengths[i]]
        assert batch.end - batch.start == pytest.approx(COST.batch_s(lengths))


@pytest.mark.parametrize("name", ["small", "mixed", "multimodel"])
@pytest.mark.parametrize("push", PUSH)
def test_one_worker_with_a_current_view_is_the_same_under_push_and_pull(
    name: str, push: str
) -> None:
    workload = make_workload(name, 3_000, COST)
    pull_log: list[BatchLog] = []
    push_log: list[BatchLog] = []
    pulled = simulate(workload, COST, workers=1, policy="pull", load=0.8, log=pull_log)
    pushed = simulate(workload, COST, workers=1, policy=push, load=0.8, log=push_log)
    assert push_log == pull_log
    assert (pushed.p50_s, pushed.p99_s, pushed.utilization) == (
        pulled.p50_s,
        pulled.p99_s,
        pulled.utilization,
    )


@pytest.mark.parametrize("policy", ["least", "p2c"])
def test_push_utilization_falls_as_the_view_goes_stale(small: Workload, policy: str) -> None:
    busy = [
        simulate(small, COST, workers=16, policy=policy, load=0.8, staleness_s=r).utilization
        for r in (0.0, 0.05, 0.2)  # a full batch takes 70 ms
    ]
    assert busy[0] >= busy[1] >= busy[2]
    assert busy[0] - busy[2] > (0.2 if policy == "least" else 0.03)


def test_pull_keeps_the_workers_busy_at_high_load(small: Workload) -> None:
    result = simulate(small, COST, workers=16, policy="pull", load=0.95)
    assert result.utilization > 0.9
    assert result.batch_requests > 0.7 * capacity(small, COST).requests_per_batch


@pytest.mark.parametrize("policy", ["pull", "p2c", "least+own"])
def test_a_fixed_seed_gives_the_same_run(small: Workload, policy: str) -> None:
    def run(seed: int) -> object:
        return simulate(
            small, COST, workers=8, policy=policy, load=0.7, staleness_s=0.02, seed=seed
        )

    assert run(1) == run(1)
    again = make_workload("small", 12_000, COST)
    assert simulate(again, COST, workers=8, policy=policy, load=0.7) == simulate(
        small, COST, workers=8, policy=policy, load=0.7
    )
    if policy == "p2c":
        assert run(1) != run(2)


def test_pull_sustains_more_load_than_stale_push_at_the_p99_target(small: Workload) -> None:
    target = 4 * capacity(small, COST).batch_s
    pull, _ = max_load(small, COST, workers=8, policy="pull", staleness_s=0.0, p99_target_s=target)
    least, _ = max_load(
        small, COST, workers=8, policy="least", staleness_s=0.1, p99_target_s=target
    )
    assert pull > 0.8
    assert least < 0.5 * pull


@pytest.mark.parametrize("name", ["small", "bursty"])
def test_arrivals_come_at_the_offered_rate(name: str) -> None:
    workload = make_workload(name, 20_000, COST)
    times = workload.arrivals(500.0)
    assert len(times) / times[-1] == pytest.approx(500.0, rel=0.1)
    assert times == sorted(times)


def test_padded_tokens_follows_the_runtime_micro_batches() -> None:
    rng = random.Random(7)
    for _ in range(300):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 120))]
        budget, cap = rng.randint(64, 4096), rng.randint(1, 64)
        passes = micro_batches(lengths, budget, cap)
        expected = sum(len(rows) * max(lengths[i] for i in rows) for rows in passes)
        assert padded_tokens(lengths, budget, cap) == expected


def test_the_fit_recovers_a_line() -> None:
    xs = [10.0, 100.0, 1000.0, 8000.0]
    a, b, r2 = fit_line(xs, [0.004 + 2e-5 * x for x in xs])
    assert a == pytest.approx(0.004)
    assert b == pytest.approx(2e-5)
    assert r2 == pytest.approx(1.0)


def test_quick_cli_writes_tables_json_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--quick", "--jobs", "1", "--out-dir", str(tmp_path)]
    argv += ["--calibration", str(tmp_path / "absent.json"), "--workers", "8"]
    assert main(argv) == 0
    data = json.loads((tmp_path / "cluster_sim.json").read_text())
    assert data["cost_model"]["source"] == "fallback"
    assert {r["policy"] for r in data["ratios"]} == set(PUSH)
    assert {r["target"] for r in data["ratios"]} == {"2x batch", "4x batch"}
    pictures = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pictures == [
        "cluster_sim_p99.png",
        "cluster_sim_staleness_p99-2x.png",
        "cluster_sim_staleness_p99-4x.png",
        "cluster_sim_utilization.png",
    ]
    assert "pull/p2c" in capsys.readouterr().out


@pytest.mark.parametrize("policy", ["rr", "least+own"])
def test_several_routers_serve_every_request_once(small: Workload, policy: str) -> None:
    log: list[BatchLog] = []
    one = simulate(small, COST, workers=8, policy=policy, load=0.8, staleness_s=0.05)
    four = simulate(
        small, COST, workers=8, policy=policy, load=0.8, staleness_s=0.05, routers=4, log=log
    )
    assert Counter(i for batch in log for i in batch.requests) == Counter(range(len(small)))
    assert four != one  # each router keeps its own turn and its own sends


def test_gpu_like_numbers_say_they_are_hypothetical() -> None:
    from bench.cluster.cost_model import FALLBACK, gpu_like

    cost = gpu_like(FALLBACK, per_token_divisor=100.0)
    assert cost.source == "hypothetical"
    assert "HYPOTHETICAL" in cost.label
    assert cost.per_token_s == pytest.approx(FALLBACK.per_token_s / 100)
    assert cost.max_batch_tokens > FALLBACK.max_batch_tokens  # the fleet's cuda profile


# Results of the simulation before it knew uneven fleets: (workload, policy, routers) ->
# (p50_s, p99_s, utilization, batch_requests) of 5 workers at load 0.8, R = 20 ms.
PINNED = {
    ("small", "pull", 1): (
        0.044817154580546414,
        0.08901106588546592,
        0.991062800786878,
        20.86046511627907,
    ),
    ("small", "rr", 3): (0.049420799179894004, 0.08479118610153247, 1.0000000000000002, 21.6375),
    ("small", "least", 3): (
        0.07238699255343384,
        0.11306273682095241,
        0.9139135336811008,
        23.85333333333333,
    ),
    ("multimodel", "pull", 3): (0.054243738158897825, 0.10513207616036224, 1.0, 23.844155844155843),
    ("multimodel", "p2c", 3): (
        0.08265266391588755,
        0.17109907406812924,
        0.9999999999999994,
        16.86868686868687,
    ),
    ("mixed", "least+own", 1): (
        0.0879082895978125,
        0.209894200454519,
        0.969691865288648,
        4.237089201877934,
    ),
}


@pytest.mark.parametrize(("name", "policy", "routers"), sorted(PINNED))
def test_an_even_fleet_runs_as_it_always_did(name: str, policy: str, routers: int) -> None:
    workload = make_workload(name, 2_000, COST)

    def run(**fleet: object) -> tuple[float, ...]:
        r = simulate(workload, COST, workers=5, policy=policy, load=0.8, staleness_s=0.02,
                     routers=routers, **fleet)  # type: ignore[arg-type]  # fmt: skip
        return (r.p50_s, r.p99_s, r.utilization, r.batch_requests)

    assert run() == PINNED[name, policy, routers]
    # Saying so explicitly changes nothing: every device at 1, every model everywhere.
    everywhere = [list(range(workload.n_models))] * 5
    assert run(slowdowns=[1.0] * 5, hosting=everywhere, pace="off") == PINNED[name, policy, routers]


def paced_batches(
    workload: Workload, pace: str, slow: list[float], target: float
) -> tuple[SimResult, dict[int, list[int]]]:
    """A pull run at high load, and the tokens of each worker's batches."""
    log: list[BatchLog] = []
    result = simulate(workload, COST, workers=len(slow), policy="pull", load=0.9,
                      slowdowns=slow, pace=pace, p99_target_s=target, log=log)  # fmt: skip
    tokens: dict[int, list[int]] = {}
    for batch in log:
        tokens.setdefault(batch.worker, []).append(sum(workload.tokens[i] for i in batch.requests))
    return result, tokens


def test_a_slow_device_taking_by_its_pace_takes_smaller_batches(small: Workload) -> None:
    slow = [1.0, 1.0, 1.0, 4.0]
    target = 2 * capacity(small, COST).batch_s
    budget = paced_budget(COST, 4.0, target, 0.5)
    assert budget < paced_budget(COST, 1.0, target, 0.5) <= COST.max_batch_tokens
    paced, paced_tokens = paced_batches(small, "pull", slow, target)
    plain, plain_tokens = paced_batches(small, "off", slow, target)
    assert (paced.pace, plain.pace) == ("pull", "off")
    assert max(paced_tokens[3]) <= budget < max(plain_tokens[3])
    mean = {k: sum(v) / len(v) for k, v in paced_tokens.items()}
    assert mean[3] < 0.6 * min(mean[0], mean[1], mean[2])
    # Taking less, the slow device keeps the p99 that taking as much as the others misses.
    assert not paced.aborted and paced.p99_s <= target
    assert plain.aborted


def test_pace_is_on_for_pull_by_default_when_the_devices_differ(small: Workload) -> None:
    def pace(policy: str, slow: list[float] | None, target: float | None) -> str:
        return simulate(small, COST, workers=2, policy=policy, load=0.3, slowdowns=slow,
                        p99_target_s=target).pace  # fmt: skip

    assert pace("pull", [1.0, 4.0], 0.2) == "pull"
    assert pace("pull", [2.0, 2.0], 0.2) == "off"
    assert pace("pull", [1.0, 4.0], None) == "off"  # no target, no budget to pace by
    assert pace("least", [1.0, 4.0], 0.2) == "pull"  # said; push's workers keep their budget
    with pytest.raises(ValueError, match="latency target"):
        simulate(small, COST, workers=2, policy="pull", load=0.3, pace="all")


@pytest.mark.parametrize("policy", POLICIES)
def test_a_worker_runs_only_the_models_it_hosts(policy: str) -> None:
    workload = with_models(make_workload("small", 4_000, COST), 16)
    hosting = popular_hosting(zipf_shares(16), per_worker_counts(8, "2-4"))
    log: list[BatchLog] = []
    result = simulate(workload, COST, workers=8, policy=policy, load=0.5, staleness_s=0.02,
                      routers=2, hosting=hosting, log=log)  # fmt: skip
    assert Counter(i for batch in log for i in batch.requests) == Counter(range(len(workload)))
    assert all(batch.model in hosting[batch.worker] for batch in log)
    assert {batch.worker for batch in log} == set(range(8))
    assert result.requests == len(workload) - len(workload) // 10


def test_a_slow_device_costs_its_slowdown_times_the_batch() -> None:
    workload = make_workload("mixed", 2_000, COST)
    slow = [1.0, 2.5]
    log: list[BatchLog] = []
    simulate(workload, COST, workers=2, policy="rr", load=0.5, slowdowns=slow, log=log)
    for batch in log:
        lengths = [n for i in batch.requests for n in workload.lengths[i]]
        assert batch.end - batch.start == pytest.approx(slow[batch.worker] * COST.batch_s(lengths))


def test_routing_within_a_models_hosts() -> None:
    live = [0, 5, 1, 0, 3]
    draws = iter([0.0, 0.99, 0.5] * 20)
    rr = SimRouter("rr", 5, 1, False, live, lambda: next(draws))
    assert [rr.route_within(1, [1, 3, 4], 7) for _ in range(4)] == [1, 3, 4, 1]
    assert rr.route_within(1, [0, 2], 8) == 0  # a turn of its own per model
    least = SimRouter("least", 5, 1, False, live, lambda: next(draws))
    assert least.route_within(1, [1, 2, 4], 0) == 2
    own = SimRouter("least+own", 5, 1, True, live, lambda: next(draws))
    own.refresh()
    assert [own.route_within(10, [0, 2], 0) for _ in range(2)] == [0, 2]  # counts its sends
    p2c = SimRouter("p2c", 5, 1, False, live, lambda: next(draws))
    assert p2c.route_within(1, [4], 0) == 4
    assert p2c.route_within(1, [1, 2], 0) == 2


def test_uneven_fleet_helpers() -> None:
    assert profile_slowdowns(6, "gens3") == [1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert profile_slowdowns(4, "1,3") == [1.0, 1.0, 3.0, 3.0]
    assert per_worker_counts(5, "2-4") == [2, 3, 4, 2, 3]
    shares = zipf_shares(16)
    for slow in ([1.0] * 12, profile_slowdowns(12, "gens3")):
        counts = per_worker_counts(12, "2-4")
        speeds = [1 / s for s in slow]
        hosting = popular_hosting(shares, counts, speeds)
        assert [len(h) for h in hosting] == counts
        assert all(len(set(h)) == len(h) for h in hosting)
        # Each model's hosts (a worker's speed split over its models) near its due share.
        capacity_of: dict[int, float] = {}
        for w, models in enumerate(hosting):
            for m in models:
                capacity_of[m] = capacity_of.get(m, 0.0) + speeds[w] / counts[w]
        assert set(capacity_of) == set(range(16))
        due = [x * sum(speeds) for x in shares]
        assert all(0.6 < capacity_of[m] / due[m] < 1.5 for m in range(16))
    names = [f"m{k}" for k in range(16)]
    by_name = hosting_map(8, names, 3)
    assert hosting_indices(by_name, names) == [[(w + k) % 16 for k in range(3)] for w in range(8)]
    with pytest.raises(ValueError, match="needs a host"):
        simulate(make_workload("multimodel", 500, COST), COST, workers=2, policy="pull",
                 load=0.5, hosting=[[0, 1], [1, 2]])  # fmt: skip


def test_pull_sustains_more_than_round_robin_on_uneven_devices(small: Workload) -> None:
    slow = profile_slowdowns(6, "gens3")
    target = 4 * capacity(small, COST).batch_s
    pull = ideal_max_load(small, COST, slow, None, target)
    rr = ideal_max_load(small, COST, slow, None, target, "rr", routers=4, staleness_s=0.05)
    assert pull > 0.8
    assert rr < 0.8 * pull  # equal shares overrun the 4x devices


def test_cli_runs_an_uneven_fleet_with_several_routers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--quick", "--jobs", "1", "--out-dir", str(tmp_path), "--workers", "6"]
    argv += ["--calibration", str(tmp_path / "absent.json"), "--workload", "small"]
    argv += ["--staleness-ms", "50", "--p99-batches", "4", "--no-sweep", "--routers", "1", "4"]
    argv += ["--slowdowns", "gens3", "--models", "16", "--models-per-worker", "2-4"]
    assert main(argv) == 0
    data = json.loads((tmp_path / "cluster_sim.json").read_text())
    fleet = data["workloads"]["small"]["fleets"]["6"]
    assert fleet["slowdowns"] == [1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert [len(h) for h in fleet["hosting"]] == [2, 3, 4, 2, 3, 4]
    assert {(r["policy"], r["routers"]) for r in data["ratios"]} == {
        (p, n) for p in PUSH for n in (1, 4)
    }
    assert next(r for r in data["max_load"] if r["policy"] == "pull")["pace"] == "pull"
    assert "pull/least (4 routers)" in capsys.readouterr().out


def test_a_slow_worker_leaves_to_a_faster_host_what_it_would_finish_late() -> None:
    queue = deque([0, 1, 2, 3, 4])
    tokens = [100] * 5
    deadline_at = [0.5, 2.0, 5.0, 2.0, 9.0]

    def take(faster: list[tuple[float, float]]) -> tuple[list[int], int, float]:
        q = deque(queue)
        chosen, total, wake = fill_in_time(
            q, tokens, 400, 64, t=0.0, deadline_at=deadline_at, run_s=lambda k: k / 400,
            slow=4.0, faster=faster,
        )  # fmt: skip
        assert sorted([*q, *chosen]) == list(queue) and list(q) == sorted(q)
        return chosen, total, wake

    # The batch of 0-3 runs 1 s at speed 1: 4 s on this worker. 1 and 3 (due at 2 s) a
    # free host at 1 could still finish; 0 (due at 0.5 s) nobody can, 2 this worker can.
    chosen, total, wake = take([(0.0, 1.0), (0.0, 4.0)])
    assert (chosen, total) == ([0, 2], 200)
    assert wake == pytest.approx(1.0) and wake > 1.0  # past 2 - 1 x 1 s, anyone's
    assert take([]) == ([0, 1, 2, 3], 400, math.inf)  # no faster host: it takes them all
    assert take([(1.5, 1.0)]) == ([0, 1, 2, 3], 400, math.inf)  # it is busy too long


def test_deadlines_leave_the_slow_device_less_and_fewer_requests_late(small: Workload) -> None:
    # At a moderate load, where the fast devices have room: near their capacity, what
    # the slow one leaves them queues behind their own work (a known limit of the rule).
    slow = [1.0, 1.0, 1.0, 4.0]
    target = 2 * capacity(small, COST).batch_s
    allowance = 0.4 * target
    times = small.arrivals(0.6 * 3.25 * capacity(small, COST).requests_per_s)

    def run(deadlines: list[float] | None) -> tuple[int, int]:
        log: list[BatchLog] = []
        simulate(small, COST, workers=4, policy="pull", load=0.6, slowdowns=slow,
                 latency_target_s=target, deadlines=deadlines, log=log)  # fmt: skip
        assert Counter(i for b in log for i in b.requests) == Counter(range(len(small)))
        late = sum(b.end - times[i] > allowance for b in log for i in b.requests)
        return late, sum(len(b.requests) for b in log if b.worker == 3)

    (late, on_slow), (late_kept, on_slow_kept) = run(None), run([allowance] * len(small))
    assert late_kept < 0.8 * late
    assert on_slow_kept < on_slow
