"""The experiments on the simulation: the highest load a policy sustains at a p99
target, and the grid of them the study runs.

The figure of merit is the highest offered load whose p99 latency stays under a
target (bisection), given in full-batch times of the workload or in ms, and pull's
over each push policy's: the throughput ratio at that p99. A ``Plan`` is the grid
(workloads, workers, staleness, policies, routers, targets, and an offered-load sweep)
on one kind of fleet (even, or uneven devices and models hosted a few per worker:
``bench.cluster.fleet``); ``run_plan`` runs its tasks (in a pool of ``jobs`` processes)
into one result dict, which ``bench.cluster.sim_report`` prints, plots and writes.
``ideal_max_load`` is the one number the real benchmark asks of the simulation.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from functools import cache
from typing import Any

import numpy as np

from bench.cluster.cost_model import CostModel
from bench.cluster.engine import SimResult, simulate
from bench.cluster.fleet import (
    Hosting,
    per_worker_counts,
    popular_hosting,
    profile_slowdowns,
    zipf_shares,
)
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
    slowdowns: Sequence[float] | None = None,
    hosting: Hosting | None = None,
    pace: str | None = None,
) -> tuple[float, SimResult | None]:
    """The highest offered load (fraction of the fleet's capacity) whose p99 latency
    stays under the target, by bisection on [0, 1] to ``tolerance`` of itself (0.005 at
    least), with the result at that load (None when even the lowest load tried misses).
    ``slowdowns``, ``hosting``, ``pace``: the fleet, as ``engine.simulate`` takes it."""
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
            slowdowns=slowdowns,
            hosting=hosting,
            pace=pace,
        )
        if not result.aborted and result.p99_s <= p99_target_s:
            low, best = mid, result
        else:
            high = mid
    return low, best


def ideal_max_load(
    workload: Workload,
    cost: CostModel,
    slowdowns: Sequence[float],
    hosting: Hosting | None,
    p99_s: float,
    policy: str = "pull",
    routers: int = 1,
    staleness_s: float = 0.0,
    *,
    pace: str | None = None,
    seed: int = SEED,
) -> float:
    """The simulation's highest load (fraction of the fleet's capacity, which counts a
    worker ``s`` times slower as ``1/s`` of one) at which ``policy`` keeps p99 under
    ``p99_s`` on a fleet of ``len(slowdowns)`` workers; ``hosting`` maps each worker to
    the model indices it hosts (None: all). Pull takes by its pace when the slowdowns
    differ unless ``pace`` says otherwise (``fleet.PACES``)."""
    load, _ = max_load(workload, cost, workers=len(slowdowns), policy=policy,
                       staleness_s=staleness_s, p99_target_s=p99_s, seed=seed, routers=routers,
                       slowdowns=slowdowns, hosting=hosting, pace=pace)  # fmt: skip
    return load


def with_models(workload: Workload, n_models: int, exponent: float = 1.0) -> Workload:
    """``workload``'s requests spread over ``n_models`` models of Zipf popularity
    (``fleet.zipf_shares``), drawn from the workload's own seed."""
    rng = np.random.default_rng(workload.seed + n_models)
    models = rng.choice(n_models, size=len(workload), p=zipf_shares(n_models, exponent)).tolist()
    return replace(workload, name=f"{workload.name}/{n_models} models", models=models,
                   n_models=n_models)  # fmt: skip


FleetLists = tuple[list[float] | None, list[list[int]] | None]  # (slowdowns, hosting)


@dataclass(frozen=True)
class Plan:
    cost: CostModel
    workloads: tuple[str, ...]
    workers: tuple[int, ...]
    staleness_ms: tuple[float, ...]
    policies: tuple[str, ...]
    targets: tuple[float, ...]  # p99 targets, in ``target_unit``
    target_unit: str  # "batches" (full-batch times of each workload) or "ms"
    routers: tuple[int, ...]  # independent push routers, each count a run of its own
    batches: float  # simulated span: this many full-batch times at load 1
    min_requests: int
    max_requests: int
    sweep_loads: tuple[float, ...]
    sweep_workers: int
    sweep_staleness_ms: float
    seed: int = SEED
    # The fleet (bench.cluster.fleet): slowdowns by profile or factors ("" every device
    # at 1), the workload's requests over this many Zipf models (0: its own models),
    # models per worker ("" every model everywhere), and which workers take by pace.
    slowdowns: str = ""
    models: int = 0
    models_per_worker: str = ""
    pace: str | None = None

    def fleet(self, workload: Workload, workers: int) -> FleetLists:
        """The slowdowns and hosting of ``workers`` workers on ``workload``."""
        slow = profile_slowdowns(workers, self.slowdowns) if self.slowdowns else None
        if not self.models_per_worker:
            return slow, None
        counts = per_worker_counts(workers, self.models_per_worker)
        seen = np.bincount(workload.models, minlength=workload.n_models)
        counts = [min(c, workload.n_models) for c in counts]
        speeds = None if slow is None else [1.0 / x for x in slow]
        return slow, popular_hosting((seen / seen.sum()).tolist(), counts, speeds)

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
    models: int = 0  # Plan.models
    slowdowns: tuple[float, ...] | None = None
    hosting: tuple[tuple[int, ...], ...] | None = None
    pace: str | None = None

    def fleet(self) -> dict[str, Any]:
        """``simulate``'s fleet arguments."""
        return {"slowdowns": self.slowdowns, "hosting": self.hosting, "pace": self.pace}


@cache
def _workload(
    name: str, n: int, cost: CostModel, seed: int, models: int = 0
) -> tuple[Workload, Capacity]:
    workload = make_workload(name, n, cost, seed)
    if models:
        workload = with_models(workload, models)
    return workload, capacity(workload, cost)


def run_task(task: Task) -> list[dict[str, Any]]:
    workload, cap = _workload(task.workload, task.n, task.cost, task.seed, task.models)
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
                        latency_target_s=task.p99_target_s,
                        **task.fleet(),
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
        **task.fleet(),
    )
    speed = sum(1.0 / s for s in task.slowdowns) if task.slowdowns else task.workers
    row: dict[str, Any] = {
        **common,
        "workers": task.workers,
        "policy": task.policy,
        "staleness_ms": task.staleness_ms,
        "max_load": load,
        "requests_per_s": load * speed * cap.requests_per_s,
        "requests_simulated": task.n,
    }
    if result is not None:
        row.update(
            {
                "pace": result.pace,
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
    """Per workload: capacity, time unit, request sizes, p99 targets, requests to run, and
    per worker count the fleet's slowdowns and hosting (None: even)."""
    facts: dict[str, dict[str, Any]] = {}
    counts = sorted({*plan.workers, plan.sweep_workers})
    for name in plan.workloads:
        workload, cap = _workload(name, 20_000, plan.cost, plan.seed, plan.models)
        fleets = {str(w): dict(zip(("slowdowns", "hosting"), plan.fleet(workload, w), strict=True))
                  for w in counts}  # fmt: skip
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
            "requests": {str(w): plan.requests(cap, w) for w in counts},
            "fleets": fleets,
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
        routers: int,
        loads: tuple[float, ...] = (),
    ) -> Task:
        n = facts[name]["requests"][str(workers)]
        label, target_ms = target
        fleet = facts[name]["fleets"][str(workers)]
        slow, hosting = fleet["slowdowns"], fleet["hosting"]
        return Task(kind, name, n, workers, policy, staleness_ms, label, target_ms / 1e3,
                    plan.cost, routers, loads, plan.seed, plan.models,
                    None if slow is None else tuple(slow),
                    None if hosting is None else tuple(tuple(h) for h in hosting),
                    plan.pace)  # fmt: skip

    def routed(policy: str) -> tuple[int, ...]:
        return (1,) if policy == "pull" else plan.routers  # pull places nothing

    tasks: list[Task] = []
    for name in plan.workloads:
        targets = list(facts[name]["p99_targets_ms"].items())
        for target, workers, policy in itertools.product(targets, plan.workers, plan.policies):
            for r in plan.staleness_ms if policy in VIEW_POLICIES else (0.0,):
                for routers in routed(policy):
                    tasks.append(task("max_load", name, workers, policy, r, target, routers))
        if plan.sweep_loads:  # at the first target, with the first count of routers
            for policy in plan.policies:
                r = plan.sweep_staleness_ms if policy in VIEW_POLICIES else 0.0
                tasks.append(task("sweep", name, plan.sweep_workers, policy, r, targets[0],
                                  routed(policy)[0], plan.sweep_loads))  # fmt: skip
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
            r["routers"],
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
    """Pull's max load over each push policy's, per workload, target, workers, staleness
    and count of routers."""
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
                "routers": r["routers"],
                "pull_max_load": p["max_load"],
                "push_max_load": r["max_load"],
                "pull_over_push": p["max_load"] / r["max_load"] if r["max_load"] else math.inf,
                "pull_utilization": p.get("utilization"),
                "push_utilization": r.get("utilization"),
            }
        )
    return out
