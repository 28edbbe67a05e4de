"""The experiments on the simulation: the highest load a policy sustains at a p99
target, and the grid of them the study runs.

The figure of merit is the highest offered load whose p99 latency stays under a
target (bisection), given in full-batch times of the workload or in ms, and pull's
over each push policy's: the throughput ratio at that p99. A ``Plan`` is the grid
(workloads, workers, staleness, policies, targets, and an offered-load sweep);
``run_plan`` runs its tasks (in a pool of ``jobs`` processes) into one result dict,
which ``bench.cluster.sim_report`` prints, plots and writes.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

import numpy as np

from bench.cluster.cost_model import CostModel
from bench.cluster.engine import SimResult, simulate
from bench.cluster.policies import POLICIES, VIEW_POLICIES
from bench.cluster.workloads import SEED, Capacity, Workload, capacity, make_workload
from embedder.core.device import cpu_model


def max_load(
    workload: Workload,
    cost: CostModel,
    *,
    workers: int,
    policy: str,
    staleness_s: float,
    p99_target_s: float,
    seed: int = SEED,
    routers: int = 1,
    tolerance: float = 0.02,
    cap: Capacity | None = None,
) -> tuple[float, SimResult | None]:
    """The highest offered load (fraction of capacity) whose p99 latency stays under
    the target, by bisection on [0, 1] to ``tolerance`` of itself (0.005 at least),
    with the result at that load (None when even the lowest load tried misses)."""
    cap = cap or capacity(workload, cost)
    low, high = 0.0, 1.0
    best: SimResult | None = None
    while high - low > max(tolerance * low, 0.005):
        mid = (low + high) / 2
        result = simulate(
            workload,
            cost,
            workers=workers,
            policy=policy,
            load=mid,
            staleness_s=staleness_s,
            seed=seed,
            p99_target_s=p99_target_s,
            cap=cap,
            routers=routers,
        )
        if not result.aborted and result.p99_s <= p99_target_s:
            low, best = mid, result
        else:
            high = mid
    return low, best


@dataclass(frozen=True)
class Plan:
    cost: CostModel
    workloads: tuple[str, ...]
    workers: tuple[int, ...]
    staleness_ms: tuple[float, ...]
    policies: tuple[str, ...]
    targets: tuple[float, ...]  # p99 targets, in ``target_unit``
    target_unit: str  # "batches" (full-batch times of each workload) or "ms"
    routers: int
    batches: float  # simulated span: this many full-batch times at load 1
    min_requests: int
    max_requests: int
    sweep_loads: tuple[float, ...]
    sweep_workers: int
    sweep_staleness_ms: float
    seed: int = SEED

    def target_s(self, target: float, cap: Capacity) -> float:
        return target * cap.batch_s if self.target_unit == "batches" else target / 1e3

    def requests(self, cap: Capacity, workers: int) -> int:
        wanted = math.ceil(self.batches * workers * cap.requests_per_batch)
        return max(self.min_requests, min(self.max_requests, wanted))


def target_label(target: float, unit: str) -> str:
    return f"{target:g}x batch" if unit == "batches" else f"{target:g} ms"


@dataclass(frozen=True)
class Task:
    kind: str  # "max_load" | "sweep"
    workload: str
    n: int
    workers: int
    policy: str
    staleness_ms: float
    target: str  # its label
    p99_target_s: float
    cost: CostModel
    routers: int = 1
    loads: tuple[float, ...] = ()
    seed: int = SEED


@cache
def _workload(name: str, n: int, cost: CostModel, seed: int) -> tuple[Workload, Capacity]:
    workload = make_workload(name, n, cost, seed)
    return workload, capacity(workload, cost)


def run_task(task: Task) -> list[dict[str, Any]]:
    workload, cap = _workload(task.workload, task.n, task.cost, task.seed)
    common = {
        "workload": task.workload,
        "target": task.target,
        "p99_target_ms": task.p99_target_s * 1e3,
        "routers": task.routers,
    }
    if task.kind == "sweep":
        return [
            {
                **common,
                **asdict(
                    simulate(
                        workload,
                        task.cost,
                        workers=task.workers,
                        policy=task.policy,
                        load=load,
                        staleness_s=task.staleness_ms / 1e3,
                        seed=task.seed,
                        cap=cap,
                        routers=task.routers,
                    )
                ),
            }
            for load in task.loads
        ]
    load, result = max_load(
        workload,
        task.cost,
        workers=task.workers,
        policy=task.policy,
        staleness_s=task.staleness_ms / 1e3,
        p99_target_s=task.p99_target_s,
        seed=task.seed,
        routers=task.routers,
        cap=cap,
    )
    row: dict[str, Any] = {
        **common,
        "workers": task.workers,
        "policy": task.policy,
        "staleness_ms": task.staleness_ms,
        "max_load": load,
        "requests_per_s": load * task.workers * cap.requests_per_s,
        "requests_simulated": task.n,
    }
    if result is not None:
        row.update(
            {
                "tokens_per_s": result.tokens_per_s,
                "utilization": result.utilization,
                "p50_ms": result.p50_s * 1e3,
                "p99_ms": result.p99_s * 1e3,
                "batch_requests": result.batch_requests,
                "batch_tokens": result.batch_tokens,
            }
        )
    return [row]


def workload_facts(plan: Plan) -> dict[str, dict[str, Any]]:
    """Per workload: capacity, time unit, request sizes, p99 targets, requests to run."""
    facts: dict[str, dict[str, Any]] = {}
    for name in plan.workloads:
        workload, cap = _workload(name, 20_000, plan.cost, plan.seed)
        facts[name] = {
            "capacity_requests_per_s_per_worker": cap.requests_per_s,
            "full_batch_requests": cap.requests_per_batch,
            "full_batch_ms": cap.batch_s * 1e3,
            "mean_request_tokens": float(np.mean(workload.tokens)),
            "p99_request_tokens": float(np.percentile(workload.tokens, 99)),
            "mean_inputs": float(np.mean([len(x) for x in workload.lengths])),
            "models": workload.n_models,
            "burst_ms": workload.burst_s * 1e3,
            "p99_targets_ms": {
                target_label(t, plan.target_unit): plan.target_s(t, cap) * 1e3 for t in plan.targets
            },
            "requests": {
                str(w): plan.requests(cap, w) for w in sorted({*plan.workers, plan.sweep_workers})
            },
        }
    return facts


def tasks_for(plan: Plan, facts: dict[str, dict[str, Any]]) -> list[Task]:
    def task(
        kind: str,
        name: str,
        workers: int,
        policy: str,
        staleness_ms: float,
        target: tuple[str, float],  # (label, ms)
        loads: tuple[float, ...] = (),
    ) -> Task:
        n = facts[name]["requests"][str(workers)]
        label, target_ms = target
        return Task(kind, name, n, workers, policy, staleness_ms, label, target_ms / 1e3,
                    plan.cost, plan.routers, loads, plan.seed)  # fmt: skip

    tasks: list[Task] = []
    for name in plan.workloads:
        targets = list(facts[name]["p99_targets_ms"].items())
        for target in targets:
            for workers in plan.workers:
                for policy in plan.policies:
                    for r in plan.staleness_ms if policy in VIEW_POLICIES else (0.0,):
                        tasks.append(task("max_load", name, workers, policy, r, target))
        if plan.sweep_loads:  # at the first target
            for policy in plan.policies:
                r = plan.sweep_staleness_ms if policy in VIEW_POLICIES else 0.0
                tasks.append(
                    task("sweep", name, plan.sweep_workers, policy, r, targets[0], plan.sweep_loads)
                )
    # The biggest first, so that the pool's processes finish together.
    tasks.sort(key=lambda t: -t.n * (len(t.loads) or 4))
    return tasks


def run_plan(plan: Plan, jobs: int) -> dict[str, Any]:
    started = time.perf_counter()
    facts = workload_facts(plan)
    tasks = tasks_for(plan, facts)
    rows: list[dict[str, Any]] = []
    step = max(1, len(tasks) // 10)

    def progress(done: int) -> None:
        if done % step == 0 or done == len(tasks):
            elapsed = time.perf_counter() - started
            print(f"  {done}/{len(tasks)} simulations done, {elapsed:.0f} s", flush=True)

    if jobs <= 1:
        for done, task in enumerate(tasks, 1):
            rows.extend(run_task(task))
            progress(done)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_task, task) for task in tasks]
            for done, future in enumerate(as_completed(futures), 1):
                rows.extend(future.result())
                progress(done)
    best = [r for r in rows if "max_load" in r]
    sweep = [r for r in rows if "max_load" not in r]
    best.sort(
        key=lambda r: (
            r["workload"],
            r["p99_target_ms"],
            r["workers"],
            POLICIES.index(r["policy"]),
            r["staleness_ms"],
        )
    )
    sweep.sort(key=lambda r: (r["workload"], POLICIES.index(r["policy"]), r["load"]))
    plan_dict = asdict(plan)
    del plan_dict["cost"]
    return {
        "benchmark": "cluster_sim",
        "cost_model": asdict(plan.cost),
        "plan": plan_dict,
        "workloads": facts,
        "max_load": best,
        "ratios": ratios(best),
        "sweep": sweep,
        "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "jobs": jobs},
        "elapsed_s": time.perf_counter() - started,
    }


def ratios(best: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pull's max load over each push policy's, per workload, target, workers, staleness."""
    pull = {(r["workload"], r["target"], r["workers"]): r for r in best if r["policy"] == "pull"}
    out = []
    for r in best:
        p = pull.get((r["workload"], r["target"], r["workers"]))
        if r["policy"] == "pull" or p is None:
            continue
        out.append(
            {
                "workload": r["workload"],
                "target": r["target"],
                "p99_target_ms": r["p99_target_ms"],
                "workers": r["workers"],
                "policy": r["policy"],
                "staleness_ms": r["staleness_ms"],
                "pull_max_load": p["max_load"],
                "push_max_load": r["max_load"],
                "pull_over_push": p["max_load"] / r["max_load"] if r["max_load"] else math.inf,
                "pull_utilization": p.get("utilization"),
                "push_utilization": r.get("utilization"),
            }
        )
    return out
