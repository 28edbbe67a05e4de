"""The push-versus-pull simulator's mechanics, with a fixed cost model (no real model)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from bench.cluster.calibrate import fit_line
from bench.cluster.cost_model import CostModel, padded_tokens
from bench.cluster.engine import BatchLog, simulate
from bench.cluster.experiments import max_load
from bench.cluster.policies import POLICIES, PUSH
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
