"""Ratios, tables and the chart for ``bench.cluster.real``'s results (a dict, as written)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench import report
from bench.cluster.sim_report import json_text

__all__ = ["json_text", "plot", "summarize", "tables"]

PULL = "pull"
# Without --p99-ms the target is this many times the best p99 of the lightest level: a
# latency every machine can be held to, however fast or busy it is.
TARGET_FACTOR = 2.0


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def throughput_at_p99(runs: list[dict[str, Any]], target_ms: float) -> dict[str, Any] | None:
    """The most tokens/s a mode served with p99 within the target: its best level that
    met it, or a point between a level that met it and the next that did not (linear
    in p99 between the two). None when no level met it."""
    points = sorted((r["concurrency"], r["latency_ms"]["p99"], r["tokens_per_s"]) for r in runs)
    best: dict[str, Any] | None = None

    def consider(tokens_per_s: float, clients: str) -> None:
        nonlocal best
        if best is None or tokens_per_s > best["tokens_per_s"]:
            best = {"tokens_per_s": tokens_per_s, "clients": clients}

    for i, (clients, p99, rate) in enumerate(points):
        if p99 > target_ms:
            continue
        consider(rate, str(clients))
        if i + 1 < len(points) and points[i + 1][1] > target_ms:
            next_clients, next_p99, next_rate = points[i + 1]
            share = (target_ms - p99) / (next_p99 - p99)
            consider(rate + share * (next_rate - rate), f"{clients}-{next_clients}")
    return best


def default_target(runs: list[dict[str, Any]]) -> tuple[float, str]:
    lightest = min(r["concurrency"] for r in runs)
    best = min(r["latency_ms"]["p99"] for r in runs if r["concurrency"] == lightest)
    return TARGET_FACTOR * best, f"{TARGET_FACTOR:g} x the best p99 at {lightest} clients"


def summarize(data: dict[str, Any], p99_target_ms: float | None) -> dict[str, Any]:
    """pull/push tokens/s at each level (the same clients: matched load) and at the p99
    target (``throughput_at_p99``), each against the best push mode there."""
    runs: list[dict[str, Any]] = data["runs"]
    if p99_target_ms is None:
        p99_target_ms, target_rule = default_target(runs)
    else:
        target_rule = "--p99-ms"
    push_modes = [m for m in data["modes"] if not m.startswith(PULL)]
    levels = sorted({r["concurrency"] for r in runs})
    per_level: list[dict[str, Any]] = []
    for c in levels:
        at = {r["mode"]: r for r in runs if r["concurrency"] == c}
        pull = next(r for r in at.values() if r["side"] == PULL)
        push = {m: at[m]["tokens_per_s"] for m in push_modes if m in at}
        best = max(push, key=lambda m: push[m]) if push else None
        per_level.append(
            {
                "concurrency": c,
                "pull_tokens_per_s": pull["tokens_per_s"],
                "push_tokens_per_s": push,
                "best_push_mode": best,
                "ratio_vs": {m: _ratio(pull["tokens_per_s"], v) for m, v in push.items()},
                "ratio_vs_best_push": _ratio(pull["tokens_per_s"], push[best]) if best else None,
            }
        )
    at_target = {
        mode: throughput_at_p99([r for r in runs if r["mode"] == mode and r["ok"]], p99_target_ms)
        for mode in data["modes"]
    }
    pull_mode = next(m for m in data["modes"] if m.startswith(PULL))
    push_at = {m: v["tokens_per_s"] for m, v in at_target.items() if m != pull_mode and v}
    best_push = max(push_at, key=lambda m: push_at[m]) if push_at else None
    pull_at = at_target[pull_mode]
    target_ratio = (
        _ratio(pull_at["tokens_per_s"], push_at[best_push]) if pull_at and best_push else None
    )
    return {
        "levels": per_level,
        "matched_load_ratio_vs_best_push_geomean": _geomean(
            [lv["ratio_vs_best_push"] or 0.0 for lv in per_level]
        ),
        "p99_target_ms": p99_target_ms,
        "p99_target_rule": target_rule,
        "at_p99_target": at_target,
        "at_p99_target_best_push_mode": best_push,
        "at_p99_target_ratio_vs_best_push": target_ratio,
        "notes": notes(data),
    }


def notes(data: dict[str, Any]) -> list[str]:
    args = data["args"]
    cores = data["machine"]["cores"]
    out = [
        f"One machine, {cores} cores, shared by everything: the load generator, the router "
        "(push) or the gateway and the nats-server (pull), and the workers "
        f"({args['workers']} per side, {args['threads']} inference thread(s) each). The "
        "'cores' columns show what each part used; what the plumbing takes, the workers lack.",
        "Closed-loop clients: load is matched by the number of requests outstanding; "
        "throughput and latency at that load are the outcome.",
        "Pull over JetStream: the gateway publishes each request to its model's work-queue "
        "subject and every worker fetches from the one durable consumer they share, about "
        "its token budget at a time, so a free worker takes whatever is queued (work "
        "stealing per message; what does not fit is handed back with a nak).",
        "Each push worker is a whole `flotilla serve` (its own gateway, in-process queue "
        "and worker); the push path's HTTP hops are client -> router -> worker.",
    ]
    if args["workers"] == 2 and "p2c" in args["policies"]:
        out.append("p2c picks two distinct workers: with two workers it is least.")
    others = [r["cpu"]["others_share"] for r in data["runs"] if "others_share" in r.get("cpu", {})]
    if others and max(others) > 0.10:
        out.append(
            f"Other processes took {100 * min(others):.0f}-{100 * max(others):.0f}% of the CPU "
            "during the runs: absolute numbers fall and ratios get noisy, and each side's "
            "share of the CPU then depends on how many busy threads it runs (compare the "
            "'workers' cores); rerun on a quiet machine or with --wait-quiet-s."
        )
    if not str(data.get("broker", "")).startswith("started"):
        out.append("The nats-server was given (--nats): its CPU is not counted.")
    return out


def _split(run: dict[str, Any]) -> str:
    router = run.get("router")
    if not router or not sum(router["requests"]):
        return "-"
    total = sum(router["requests"])
    return "/".join(f"{100 * n / total:.0f}" for n in router["requests"])


def _cores(run: dict[str, Any]) -> tuple[float, float, float]:
    cores = run["cores"]
    if run["side"] == PULL:
        return (
            cores.get("pull workers", 0.0),
            cores.get("gateway", 0.0) + cores.get("broker", 0.0),
            cores.get("client", 0.0),
        )
    return cores.get("push workers", 0.0), cores.get("router", 0.0), cores.get("client", 0.0)


def tables(data: dict[str, Any]) -> str:
    summary = data["summary"]
    order = {m: i for i, m in enumerate(data["modes"])}
    runs = sorted(data["runs"], key=lambda r: (r["concurrency"], order[r["mode"]]))
    rows: list[list[object]] = []
    for r in runs:
        workers, plumbing, client = _cores(r)
        rows.append(
            [
                r["concurrency"],
                r["mode"],
                r["ok"],
                sum(r["errors"].values()),
                r["requests_per_s"],
                r["tokens_per_s"],
                r["latency_ms"]["p50"],
                r["latency_ms"]["p99"],
                r["mean_requests_per_batch"] or float("nan"),
                _split(r),
                f"{workers:.2f}",
                f"{plumbing:.2f}",
                f"{client:.2f}",
                f"{100 * r['cpu'].get('others_share', 0):.0f}%",
            ]
        )
    headers = [
        "clients", "mode", "ok", "errors", "req/s", "tok/s", "p50 ms", "p99 ms", "req/batch",
        "split %", "cores: workers", "plumbing", "client", "others' CPU",
    ]  # fmt: skip
    out = [
        f"{data['model']}; {data['args']['workers']} workers per side x "
        f"{data['args']['threads']} thread(s); {data['workload']['clients']} clients, "
        f"{data['args']['duration_s']:g} s per run; requests of 1-8 texts (uniform), "
        f"{data['workload']['mean_tokens']:.0f} tokens on average",
        report.table(headers, rows),
        "plumbing: the router (push) or the gateway + broker (pull); split: the router's "
        "requests per worker",
        "",
    ]
    push_modes = [m for m in data["modes"] if not m.startswith(PULL)]
    ratio_rows: list[list[object]] = []
    for lv in summary["levels"]:
        ratio_rows.append(
            [lv["concurrency"]]
            + [_fmt(lv["ratio_vs"].get(m)) for m in push_modes]
            + [_fmt(lv["ratio_vs_best_push"])]
        )
    out.append("pull / push tokens/s at the same clients:")
    out.append(report.table(["clients", *push_modes, "vs best push"], ratio_rows))
    target = summary["p99_target_ms"]
    best_lines = []
    for mode, best in summary["at_p99_target"].items():
        if best is None:
            best_lines.append(f"  {mode}: no level met it")
        else:
            best_lines.append(
                f"  {mode}: {best['tokens_per_s']:,.0f} tok/s (at {best['clients']} clients)"
            )
    out.append(
        f"\nmost tokens/s with p99 <= {target:,.0f} ms ({summary['p99_target_rule']}): at a "
        "level that met it, or interpolated between one that did and the next that did not"
    )
    out.extend(best_lines)
    out.append(
        f"\nRATIO pull/push (tokens/s): {_fmt(summary['matched_load_ratio_vs_best_push_geomean'])}"
        " at matched load (geometric mean over levels, against the best push mode at each); "
        f"{_fmt(summary['at_p99_target_ratio_vs_best_push'])} at p99 <= {target:,.0f} ms "
        f"(against {summary['at_p99_target_best_push_mode'] or '-'})"
    )
    out.append(f"the same request both ways: worst cosine {data['cosine_push_vs_pull']:.6f}")
    out.append("\nnotes:")
    out.extend(f"- {n}" for n in summary["notes"])
    return "\n".join(out)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode in data["modes"]:
        runs = sorted(
            (r for r in data["runs"] if r["mode"] == mode), key=lambda r: r["concurrency"]
        )
        style = "o-" if mode.startswith(PULL) else "s--"
        xs = [r["concurrency"] for r in runs]
        ys = [r["tokens_per_s"] for r in runs]
        left.plot(xs, ys, style, label=mode)
        right.plot(ys, [r["latency_ms"]["p99"] for r in runs], style, label=mode)
    levels = sorted({r["concurrency"] for r in data["runs"]})
    left.set_xscale("log", base=2)
    left.set_xticks(levels, [str(c) for c in levels])
    left.minorticks_off()
    left.set_xlabel("concurrent clients")
    left.set_ylabel("tokens/s")
    left.set_ylim(bottom=0)
    left.set_title("throughput at matched load")
    left.legend(fontsize=8)
    right.axhline(data["summary"]["p99_target_ms"], color="grey", linestyle=":", label="p99 target")
    right.set_yscale("log")
    right.set_xlabel("tokens/s")
    right.set_ylabel("p99 latency, ms")
    right.set_title("p99 against throughput (one point per level)")
    right.legend(fontsize=8)
    args = data["args"]
    fig.suptitle(
        f"push (router) vs pull (JetStream), real processes: {data['model']}, {args['workers']} "
        f"workers x {args['threads']} thread(s); {data['machine']['cpu']}, "
        f"{data['machine']['cores']} cores shared by all",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
