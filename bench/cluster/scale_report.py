"""The cluster-scale run's summary, tables and chart (pure but the chart).

Per workload and mode: the most tokens/s served at an offered load whose p99 met the
target with at most ``MAX_ERROR_SHARE`` errors (0 when none did), the device busy
fractions there, and pull/push against each push policy and the best one. The host
path's CPU (client, router, gateway, broker) is checked against half the machine's
cores in every run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAX_ERROR_SHARE = 0.01
TARGET_UNITS = 10.0  # the default p99 target, in single-request service times
HOST_ROLES = ("client", "router", "gateway", "broker")


def line(run: dict[str, Any]) -> str:
    lat, busy = run["latency_ms"], run["busy"]
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    return (
        f"  {run['workload']:<10} {run['mode']:<22} load {run['load']:.2f} "
        f"{run['tokens_per_s']:>8,.0f} tok/s  p99 {lat['p99']:>7,.0f} ms  "
        f"busy {100 * mean_busy:>3.0f}%  errors {run['sent'] - run['ok']}  "
        f"host {host_cores(run):.2f} cores"
    )


def host_cores(run: dict[str, Any]) -> float:
    return float(sum(v for k, v in run["cores"].items() if k in HOST_ROLES))


def target_ms(data: dict[str, Any], workload: str, p99_ms: float | None) -> float:
    if p99_ms is not None:
        return float(p99_ms)
    return TARGET_UNITS * 1e3 * float(data["workloads"][workload]["single_request_s"])


def at_target(runs: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The run with the most tokens/s among those that met the target, if any did."""
    met = [
        r for r in runs if r["latency_ms"]["p99"] <= target and r["error_share"] <= MAX_ERROR_SHARE
    ]
    return max(met, key=lambda r: r["tokens_per_s"]) if met else None


def summarize(data: dict[str, Any], p99_ms: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cores = os.cpu_count() or 2
    for workload in data["workloads"]:
        target = target_ms(data, workload, p99_ms)
        runs = [r for r in data["runs"] if r["workload"] == workload]
        modes: dict[str, Any] = {}
        for mode in dict.fromkeys(r["mode"] for r in runs):
            best = at_target([r for r in runs if r["mode"] == mode], target)
            busy = best["busy"] if best else []
            modes[mode] = {
                "tokens_per_s_at_target": best["tokens_per_s"] if best else 0.0,
                "load": best["load"] if best else None,
                "p99_ms": best["latency_ms"]["p99"] if best else None,
                "busy_mean": sum(busy) / len(busy) if busy else None,
                "busy_min": min(busy) if busy else None,
                "busy_max": max(busy) if busy else None,
            }
        pull = next((m for m in modes if m.startswith("pull")), None)
        push = {m: v for m, v in modes.items() if m.startswith("push")}
        ratios: dict[str, float | None] = {}
        if pull is not None:
            p = modes[pull]["tokens_per_s_at_target"]
            for m, v in push.items():
                q = v["tokens_per_s_at_target"]
                ratios[m] = p / q if q > 0 else None
        best_push = max(push.values(), key=lambda v: v["tokens_per_s_at_target"], default=None)
        best_q = best_push["tokens_per_s_at_target"] if best_push else 0.0
        out[workload] = {
            "p99_target_ms": target,
            "modes": modes,
            "pull_over_push": ratios,
            "pull_over_best_push": (
                modes[pull]["tokens_per_s_at_target"] / best_q if pull and best_q > 0 else None
            ),
            "pull": data["workloads"][workload].get("pull", "run"),
        }
    hosts = [host_cores(r) for r in data["runs"]]
    worst = max(hosts, default=0.0)
    out["host_path"] = {
        "worst_cores": worst,
        "limit_cores": cores / 2,
        "under_half": worst <= cores / 2,
        "device_scale": data["device"]["scale"],
    }
    return out


def _fmt(x: float | None, pattern: str = "{:.2f}") -> str:
    return "n/a" if x is None else pattern.format(x)


def tables(data: dict[str, Any]) -> str:
    s = data["summary"]
    lines = [f"device: {data['device']['label']} (scale x{data['device']['scale']:.3g})"]
    for workload, w in s.items():
        if workload == "host_path":
            continue
        lines.append(
            f"\n{workload}: p99 target {w['p99_target_ms']:,.0f} ms"
            + ("" if w["pull"] == "run" else f"; pull {w['pull']}")
        )
        lines.append(
            f"  {'mode':<22} {'tok/s at p99':>13} {'load':>5} {'busy mean/min/max':>20}"
            f" {'pull/push':>9}"
        )
        for mode, m in w["modes"].items():
            busy = "/".join(_fmt(m[k], "{:.0%}") for k in ("busy_mean", "busy_min", "busy_max"))
            ratio = w["pull_over_push"].get(mode)
            lines.append(
                f"  {mode:<22} {m['tokens_per_s_at_target']:>13,.0f} "
                f"{_fmt(m['load']):>5} {busy:>20} {_fmt(ratio):>9}"
            )
        lines.append(f"  pull / best push: {_fmt(w['pull_over_best_push'])}")
    h = s["host_path"]
    lines.append(
        f"\nhost path (client, router, gateway, broker): at most {h['worst_cores']:.2f} cores "
        f"of {2 * h['limit_cores']:.0f} ({'under' if h['under_half'] else 'OVER'} half); "
        f"device costs x{h['device_scale']:.3g}"
    )
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = data["summary"]
    workloads = [w for w in s if w != "host_path"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    modes = list(dict.fromkeys(m for w in workloads for m in s[w]["modes"]))
    width = 0.8 / max(1, len(modes))
    for k, mode in enumerate(modes):
        xs = [i + k * width for i in range(len(workloads))]
        tput = [s[w]["modes"].get(mode, {}).get("tokens_per_s_at_target", 0.0) for w in workloads]
        busy = [s[w]["modes"].get(mode, {}).get("busy_mean") or 0.0 for w in workloads]
        axes[0].bar(xs, tput, width, label=mode)
        axes[1].bar(xs, busy, width, label=mode)
    for ax, title in zip(
        axes, ("tokens/s at the p99 target", "mean device busy fraction"), strict=True
    ):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"{len(data['runs'][0]['busy']) if data['runs'] else 0} workers a side; "
        f"{data['device']['label'][:90]}",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
