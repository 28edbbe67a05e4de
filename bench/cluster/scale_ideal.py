"""The simulation's ideal beside a cluster-scale run: the same fleet simulated.

For each workload of a ``bench.cluster.scale`` run, ``bench.cluster.experiments``
simulates the same devices (slowdowns), the same hosting map, the same request sizes
and models, the same cost model (scale included) and p99 target, and for push the same
number of routers K and the same view staleness in device time: the highest load each
mode could reach with no host path, no broker and an ideal shared queue. Two things the
simulation does not model are approximated and said so in the result: a shifting
popularity is simulated at its average (the ranks drawn, unshifted), and sharp bursts
as the simulation's own on/off arrivals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bench.cluster.emulation import device_cost
from bench.cluster.experiments import ideal_max_load
from bench.cluster.scale_load import build
from bench.cluster.workloads import Workload

APPROXIMATED = {
    "manymodels": "popularity simulated unshifted (the same Zipf ranks)",
    "bursty": "bursts simulated as on/off arrivals at twice the mean rate",
}


def _workload(name: str, info: Mapping[str, Any], cost: Any, seed: int) -> Workload:
    requests = build(name, int(info["n_requests"]), cost, seed)
    workload = requests.workload
    if len(info["models"]) > 1:
        workload = replace(workload, models=list(requests.ranks), n_models=len(info["models"]))
    if name == "bursty":
        workload = replace(workload, burst_s=cost.full_batch_s())
    return workload


def _hosting(info: Mapping[str, Any]) -> list[list[int]]:
    index = {m: i for i, m in enumerate(info["models"])}
    return [[index[m] for m in info["hosting"][w]] for w in sorted(info["hosting"], key=int)]


def simulate_run(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per workload: the simulated max load of pull and, per K, of each push policy at
    each view refresh (the keys the run's modes use)."""
    args, device = data["args"], data["device"]
    cost = device_cost(args["device"], float(device["scale"]))
    out: dict[str, dict[str, Any]] = {}
    for name, info in data["workloads"].items():
        workload = _workload(name, info, cost, int(args["seed"]))
        slowdowns, hosting = list(info["slowdowns"]), _hosting(info)
        p99_s = float(info["p99_target_ms"]) / 1e3
        result: dict[str, Any] = {
            "pull": ideal_max_load(workload, cost, slowdowns, hosting, p99_s),
            "push": {},
            "approximated": APPROXIMATED.get(name),
        }
        for k in args["gateways"]:
            for policy in args["policies"]:
                for r_ms in device["refresh_ms_wall"]:
                    load = ideal_max_load(workload, cost, slowdowns, hosting, p99_s, policy,
                                          routers=int(k), staleness_s=r_ms / 1e3)  # fmt: skip
                    result["push"].setdefault(str(k), {})[f"{policy} R={r_ms:g}ms"] = load
        out[name] = result
    return out
