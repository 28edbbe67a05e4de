"""The cluster-scale run's summary, tables and chart (pure but the chart).

Per workload, per K (entry points: gateways for pull, routers for push) and mode: the
highest offered load whose runs met the p99 target with at most ``MAX_ERROR_SHARE``
errors (``scale_search.meets_target``: each latency class's median p99 over the seeds
within its own deadline, the errors pooled),
the tokens/s served there (the mean over the seeds), every worker's device busy fraction
there, and pull/push against each push policy and the best one. The host path's CPU
(client, routers, gateways, broker) is checked against half the machine's cores in every
run. ``beside_simulated`` prints what the simulation predicts for an ideal pull beside
the measured one.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.cluster.scale_search import MAX_ERROR_SHARE, class_p99s, highest_met

__all__ = ["MAX_ERROR_SHARE", "beside_simulated", "plot", "summarize", "tables"]

TARGET_UNITS = 10.0  # the default p99 target, in single-request service times
HOST_ROLES = ("client", "router", "gateway", "broker")


def line(run: dict[str, Any]) -> str:
    lat, busy = run["latency_ms"], run["busy"]
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    return (
        f"  {run['workload']:<10} K={run.get('gateways', 1):<2} {run['mode']:<26} "
        f"load {run['load']:.2f} {run['tokens_per_s']:>8,.0f} tok/s  p99 {lat['p99']:>7,.0f} ms"
        f"  busy {100 * mean_busy:>3.0f}%  errors {run['sent'] - run['ok']}/{run['sent']}  "
        f"host {host_cores(run):.2f} cores  {run.get('wall_s', 0):.0f} s"
    )


def host_cores(run: dict[str, Any]) -> float:
    return float(sum(v for k, v in run["cores"].items() if k in HOST_ROLES))


def target_ms(data: dict[str, Any], workload: str, p99_ms: float | None) -> float:
    if p99_ms is not None:
        return float(p99_ms)
    info = data["workloads"][workload]
    if info.get("p99_target_ms"):
        return float(info["p99_target_ms"])
    return TARGET_UNITS * 1e3 * float(info["single_request_s"])


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def mode_at_target(
    runs: Sequence[dict[str, Any]], target: float, of_target: Mapping[str, float]
) -> dict[str, Any]:
    """One mode's runs (every load and seed): its highest load within the target and
    what it served there, averaged over the seeds."""
    by_load: dict[float, list[dict[str, Any]]] = {}
    for r in runs:
        by_load.setdefault(r["load"], []).append(r)
    best = highest_met(by_load, target, of_target)
    at = by_load.get(best, []) if best is not None else []
    workers = len(at[0]["busy"]) if at else 0
    busy = [_mean([r["busy"][w] for r in at]) or 0.0 for w in range(workers)]
    return {
        "load": best,
        "tokens_per_s_at_target": _mean([r["tokens_per_s"] for r in at]) or 0.0,
        "p99_ms": statistics.median(r["latency_ms"]["p99"] for r in at) if at else None,
        "p99_ms_by_class": {
            c: statistics.median(p99s) if (p99s := class_p99s(at, c)) else None for c in of_target
        },
        "busy": busy,
        "busy_mean": _mean(busy),
        "busy_min": min(busy) if busy else None,
        "busy_max": max(busy) if busy else None,
        "loads_tried": sorted(by_load),
    }


def _ratios(modes: dict[str, Any]) -> tuple[dict[str, float | None], float | None]:
    """Pull over each push mode, and over the best one, in tokens/s at the target."""
    pull = next((m for m in modes if m.startswith("pull")), None)
    push = {m: v["tokens_per_s_at_target"] for m, v in modes.items() if m.startswith("push")}
    if pull is None:
        return {}, None
    p = modes[pull]["tokens_per_s_at_target"]
    ratios = {m: (p / q if q > 0 else None) for m, q in push.items()}
    best = max(push.values(), default=0.0)
    return ratios, (p / best if best > 0 else None)


def summarize(data: dict[str, Any], p99_ms: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    of_target = {c["name"]: float(c["of_target"]) for c in data["latency_classes"]}
    for workload in data["workloads"]:
        target = target_ms(data, workload, p99_ms)
        runs = [r for r in data["runs"] if r["workload"] == workload]
        by_k: dict[str, Any] = {}
        for k in sorted({r.get("gateways", 1) for r in runs}):
            at_k = [r for r in runs if r.get("gateways", 1) == k]
            modes = {
                m: mode_at_target([r for r in at_k if r["mode"] == m], target, of_target)
                for m in dict.fromkeys(r["mode"] for r in at_k)
            }
            ratios, over_best = _ratios(modes)
            by_k[str(k)] = {
                "modes": modes,
                "pull_over_push": ratios,
                "pull_over_best_push": over_best,
            }
        out[workload] = {
            "p99_target_ms": target,
            "by_gateways": by_k,
            "pull": data["workloads"][workload].get("pull", "run"),
        }
    cores = os.cpu_count() or 2
    worst = max((host_cores(r) for r in data["runs"]), default=0.0)
    out["host_path"] = {
        "worst_cores": worst,
        "limit_cores": cores / 2,
        "under_half": worst <= cores / 2,
        "device_scale": data["device"]["scale"],
    }
    return out


def _fmt(x: float | None, pattern: str = "{:.2f}") -> str:
    return "n/a" if x is None else pattern.format(x)


def _workload_lines(workload: str, w: dict[str, Any]) -> list[str]:
    lines = [
        f"\n{workload}: p99 target {w['p99_target_ms']:,.0f} ms"
        + ("" if w["pull"] == "run" else f"; pull {w['pull']}")
    ]
    for k, g in w["by_gateways"].items():
        lines.append(
            f"  K={k:<3} {'mode':<26} {'max load':>8} {'tok/s at p99':>13} "
            f"{'busy mean/min/max':>18} {'pull/push':>9}"
        )
        for mode, m in g["modes"].items():
            busy = "/".join(_fmt(m[b], "{:.0%}") for b in ("busy_mean", "busy_min", "busy_max"))
            lines.append(
                f"        {mode:<26} {_fmt(m['load']):>8} {m['tokens_per_s_at_target']:>13,.0f} "
                f"{busy:>18} {_fmt(g['pull_over_push'].get(mode)):>9}"
            )
        lines.append(f"        pull / best push: {_fmt(g['pull_over_best_push'])}")
    return lines


def tables(data: dict[str, Any]) -> str:
    s = data["summary"]
    d = data["device"]
    lines = [f"device: {d['label']} (scale x{d['scale']:.3g})"]
    if "refresh_ms_device" in d:
        lines.append(
            f"view: R {d['refresh_ms_device']} ms device time = "
            f"{[round(r) for r in d['refresh_ms_wall']]} ms wall; report delay "
            f"{d['report_delay_ms_device']:g} ms device = {d['report_delay_ms_wall']:.0f} ms wall"
        )
    for workload, w in s.items():
        if workload != "host_path":
            lines += _workload_lines(workload, w)
    h = s["host_path"]
    lines.append(
        f"\nhost path (client, routers, gateways, broker): at most {h['worst_cores']:.2f} cores "
        f"of {2 * h['limit_cores']:.0f} ({'under' if h['under_half'] else 'OVER'} half); "
        f"device costs x{h['device_scale']:.3g}"
    )
    return "\n".join(lines)


def beside_simulated(
    summary: dict[str, Any], simulated: Mapping[str, Mapping[str, Any]] | None = None
) -> str:
    """The measured max loads beside the simulation's for the same fleet, per workload
    and K: pull, and the best push policy.

    ``simulated`` maps a workload to ``bench.cluster.scale_ideal.simulate_run``'s result:
    ``{"pull": load, "push": {K: {mode: load}}, "approximated": what it left out}`` (any
    part may be missing). None or empty: nothing is simulated, and each line says so."""
    simulated = simulated or {}
    lines = [
        "max load at the target, measured beside simulated (an ideal queue, no host path;"
        " the simulation searches loads up to 1.0):"
    ]
    for workload, w in summary.items():
        if workload == "host_path":
            continue
        sim = simulated.get(workload, {})
        for k, g in w["by_gateways"].items():
            pull = next((v for m, v in g["modes"].items() if m.startswith("pull")), None)
            push = [v["load"] for m, v in g["modes"].items() if not m.startswith("pull")]
            sim_push = list(sim.get("push", {}).get(str(k), {}).values())
            lines.append(
                f"  {workload:<10} K={k:<3} pull real {_fmt(pull['load'] if pull else None):>5}"
                f"  simulated {_fmt(sim.get('pull')) if sim else 'not simulated':>5}"
                f"   best push real {_fmt(_best(push)):>5}  simulated {_fmt(_best(sim_push)):>5}"
            )
        if sim.get("approximated"):
            lines.append(f"  {'':<10} (simulated: {sim['approximated']})")
    return "\n".join(lines)


def _best(loads: Sequence[float | None]) -> float | None:
    found = [x for x in loads if x is not None]
    return max(found) if found else None


def plot(data: dict[str, Any], path: Path) -> None:
    """Per workload and K, each mode's max load, tokens/s and mean busy fraction there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = data["summary"]
    groups = [(w, k) for w in s if w != "host_path" for k in s[w]["by_gateways"]]
    modes = list(dict.fromkeys(m for w, k in groups for m in s[w]["by_gateways"][k]["modes"]))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    width = 0.8 / max(1, len(modes))
    panels = (
        ("load", "max offered load at the p99 target"),
        ("tokens_per_s_at_target", "tokens/s there"),
        ("busy_mean", "mean device busy fraction there"),
    )
    for j, mode in enumerate(modes):
        xs = [i + j * width for i in range(len(groups))]
        for ax, (key, _) in zip(axes, panels, strict=True):
            ys = [s[w]["by_gateways"][k]["modes"].get(mode, {}).get(key) or 0.0 for w, k in groups]
            ax.bar(xs, ys, width, label=mode)
    for ax, (_, title) in zip(axes, panels, strict=True):
        ax.set_xticks(
            [i + 0.4 - width / 2 for i in range(len(groups))],
            [f"{w}\nK={k}" for w, k in groups],
            fontsize=7,
        )
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"{len(data['runs'][0]['busy']) if data['runs'] else 0} workers a side; "
        f"{data['device']['label'][:110]}",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
