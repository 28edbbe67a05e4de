"""Tables, plots and JSON for the simulation's results (a dict, as written)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench import report
from bench.cluster.policies import POLICIES, VIEW_POLICIES


def _find(rows: list[dict[str, Any]], **wanted: object) -> dict[str, Any] | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in wanted.items())), None)


def _slug(target: str) -> str:
    return "p99-" + target.replace("x batch", "x").replace(" ms", "ms").replace(".", "_")


def tables(data: dict[str, Any]) -> str:
    """Per workload and p99 target: pull's max load and busy share, then pull/push."""
    plan, facts = data["plan"], data["workloads"]
    staleness = [float(r) for r in plan["staleness_ms"]]
    out: list[str] = [f"cost model: {data['cost_model']['label']}"]
    if list(plan["routers"]) != [1]:
        out.append("independent push routers: " + ", ".join(map(str, plan["routers"])))
    out.extend(_fleet_lines(plan))
    for name in plan["workloads"]:
        f = facts[name]
        for target, target_ms in f["p99_targets_ms"].items():
            out.append(
                f"\n== {name}, p99 target {target_ms:,.0f} ms ({target}): a full batch is "
                f"{f['full_batch_requests']:.0f} requests in {f['full_batch_ms']:,.0f} ms; "
                f"capacity {f['capacity_requests_per_s_per_worker']:,.1f} requests/s per worker"
            )
            out.append(_target_table(data, name, target, staleness))
    out.append(
        "\ncells: pull's max load / push's max load at the p99 target (push's max load, its "
        "busy share); rr does not read the view, so its cells repeat across R"
    )
    if data["sweep"]:
        out.append(
            f"\n== offered load sweep: {plan['sweep_workers']} workers, "
            f"R={plan['sweep_staleness_ms']:g} ms; cells: p99 ms / busy share"
        )
        for name in plan["workloads"]:
            rows: list[list[object]] = []
            for load in plan["sweep_loads"]:
                cells: list[object] = []
                for policy in plan["policies"]:
                    r = _find(data["sweep"], workload=name, policy=policy, load=load)
                    p99 = "-" if r is None or r["p99_s"] is None else f"{r['p99_s'] * 1e3:,.0f}"
                    cells.append("-" if r is None else f"{p99} / {r['utilization']:.2f}")
                rows.append([name, load, *cells])
            out.append(report.table(["workload", "load", *plan["policies"]], rows))
    return "\n".join(out)


def _fleet_lines(plan: dict[str, Any]) -> list[str]:
    """What the fleet is, when it is not every device at 1 hosting every model."""
    out = []
    if plan.get("slowdowns"):
        out.append(f"devices: slowdowns {plan['slowdowns']} (load: share of the fleet's capacity)")
    if plan.get("models"):
        out.append(f"requests over {plan['models']} Zipf-popular models")
    if plan.get("models_per_worker"):
        out.append(f"models per worker: {plan['models_per_worker']}, replicas by popularity")
    if out:
        out.append(f"pace: {plan.get('pace') or 'default (pull, when the slowdowns differ)'}")
    return out


def _target_table(data: dict[str, Any], name: str, target: str, staleness: list[float]) -> str:
    plan = data["plan"]
    routers = list(plan["routers"])
    rows: list[list[object]] = []
    for workers in plan["workers"]:
        key = {"workload": name, "target": target, "workers": workers}
        pull = _find(data["max_load"], policy="pull", **key)
        if pull is not None:
            util = pull.get("utilization") or math.nan
            paced = "" if pull.get("pace", "off") == "off" else f", pace {pull['pace']}"
            cell = f"{pull['max_load']:.2f} (busy {util:.2f}{paced})"
            rows.append([workers, "pull max load", *[cell] * len(staleness)])
        for policy, count in [(p, n) for p in plan["policies"] if p != "pull" for n in routers]:
            cells: list[object] = []
            for r_ms in staleness:
                at = r_ms if policy in VIEW_POLICIES else 0.0
                row = _find(data["ratios"], policy=policy, staleness_ms=at, routers=count, **key)
                if row is None:
                    cells.append("-")
                    continue
                busy = row["push_utilization"]
                cells.append(
                    f"{row['pull_over_push']:.2f}x ({row['push_max_load']:.2f}, "
                    + ("-" if busy is None else f"{busy:.2f}")
                    + ")"
                )
            label = f"pull/{policy}" + (f" ({count} routers)" if routers != [1] else "")
            rows.append([workers, label, *cells])
    return report.table(["workers", "", *[f"R={r:g} ms" for r in staleness]], rows)


def plots(data: dict[str, Any], out_dir: Path, prefix: str) -> list[Path]:
    """One figure of the highest load per p99 target, and (when the run swept the load)
    one of utilization and one of the p99 against the offered load."""
    import matplotlib

    matplotlib.use("Agg")
    names = data["plan"]["workloads"]
    note = (
        " (HYPOTHETICAL gpu-like costs)" if data["cost_model"]["source"] == "hypothetical" else ""
    )
    written: list[Path] = []
    for target in data["workloads"][names[0]]["p99_targets_ms"]:
        path = out_dir / f"{prefix}_staleness_{_slug(target)}.png"
        _staleness_figure(data, target, note, path)
        written.append(path)
    if not data["sweep"]:
        return written
    for key, ylabel, suffix in (
        ("utilization", "busy share of the workers", "utilization"),
        ("p99_s", "p99 latency (ms)", "p99"),
    ):
        path = out_dir / f"{prefix}_{suffix}.png"
        _sweep_figure(data, key, ylabel, note, path)
        written.append(path)
    return written


_COLORS = {p: f"C{i}" for i, p in enumerate(POLICIES)}


def _staleness_figure(data: dict[str, Any], target: str, note: str, path: Path) -> None:
    """A grid of workloads by worker counts: each policy's highest load against R."""
    import matplotlib.pyplot as plt

    plan = data["plan"]
    names, workers = plan["workloads"], plan["workers"]
    fig, axes = plt.subplots(
        len(names),
        len(workers),
        figsize=(3.0 * len(workers), 2.4 * len(names)),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    for i, name in enumerate(names):
        for j, w in enumerate(workers):
            ax = axes[i][j]
            _staleness_panel(ax, data, name, target, w)
            if i == len(names) - 1:
                ax.set_xlabel("staleness R (ms)", fontsize=8)
            if j == 0:
                ax.set_ylabel("max load at p99 target", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"highest offered load (share of capacity) with p99 under {target}{note}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _staleness_panel(ax: Any, data: dict[str, Any], name: str, target: str, w: int) -> None:
    plan = data["plan"]
    for policy in plan["policies"]:
        # One count of routers per figure: the first the plan ran.
        want = (name, target, w, policy, 1 if policy == "pull" else plan["routers"][0])
        rows = [
            r
            for r in data["max_load"]
            if (r["workload"], r["target"], r["workers"], r["policy"], r["routers"]) == want
        ]
        if not rows:
            continue
        xs = [float(x) for x in plan["staleness_ms"]]
        if policy in VIEW_POLICIES:
            xs = [r["staleness_ms"] for r in rows]
            ys = [r["max_load"] for r in rows]
        else:  # a policy blind to the workers' load: one value at every R
            ys = [rows[0]["max_load"]] * len(xs)
        style = "-" if policy == "pull" else "--" if policy == "rr" else "-o"
        ax.plot(xs, ys, style, color=_COLORS[policy], label=policy, markersize=3)
    ax.set_xscale("symlog", linthresh=5)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{name}, {w} workers", fontsize=8)
    ax.tick_params(labelsize=7)


def _sweep_figure(data: dict[str, Any], key: str, ylabel: str, note: str, path: Path) -> None:
    """One panel per workload: each policy's ``key`` against the offered load."""
    import matplotlib.pyplot as plt

    plan = data["plan"]
    names = plan["workloads"]
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2), squeeze=False)
    for j, name in enumerate(names):
        ax = axes[0][j]
        for policy in plan["policies"]:
            rows = [r for r in data["sweep"] if (r["workload"], r["policy"]) == (name, policy)]
            xs = [r["load"] for r in rows if r[key] is not None]
            ys = [r[key] * (1e3 if key == "p99_s" else 1) for r in rows if r[key] is not None]
            ax.plot(xs, ys, "-o", color=_COLORS[policy], label=policy, markersize=3)
        if key == "p99_s":
            ax.set_yscale("log")
            first = next(iter(data["workloads"][name]["p99_targets_ms"].values()))
            ax.axhline(first, color="k", ls=":", lw=1)
        else:
            ax.plot([0, 1], [0, 1], color="0.7", lw=0.8, ls=":")
            ax.set_ylim(0, 1.05)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("offered load (share of capacity)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel(ylabel, fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"{ylabel} vs offered load: {plan['sweep_workers']} workers, "
        f"R={plan['sweep_staleness_ms']:g} ms{note}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def json_text(data: dict[str, Any]) -> str:
    """JSON with infinities (an aborted run's latencies) as null."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(data), indent=1) + "\n"
