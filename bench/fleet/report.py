"""The fleet run's report: the JSON (every figure, the machine, the verdict and why), a
Markdown table per model, and a chart (the resident set against the bound over time, and
each request by model and outcome). ``result`` is pure: what the run measured in, the
report's data out."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bench.fleet.accounting as accounting
import bench.fleet.check as check
import bench.fleet.memory as memory
import bench.fleet.state as state
from bench.cluster.sim_report import json_text
from bench.fleet.accounting import Answer
from bench.fleet.fleetfile import Entry, Kind
from bench.fleet.memory import MB, Bound, Sample
from bench.fleet.traffic import Shape


@dataclass(frozen=True)
class Inputs:
    args: argparse.Namespace
    entries: Sequence[Entry]
    shape: Shape
    answers: Sequence[Answer]
    polls: Sequence[state.Seen]
    metrics: str
    models: Sequence[dict[str, Any]]  # /v1/models' data after the run
    samples: Sequence[Sample]
    load_at_s: float  # when the load began, on the samples' clock
    bound: Bound
    calibration: dict[str, Any]
    per_kind: dict[Kind, int]  # calibrated bytes per copy
    budget_source: str
    server_budget: int  # what the server was given: the on-demand budget and pinned room
    planned_budget: int  # the on-demand budget as calibrated (the bound's: what was left)
    pinned: Sequence[str]  # entries loaded at start, never asked for
    machine: dict[str, Any]
    cpu: dict[str, float]
    elapsed_s: float
    unread: Sequence[str] = ()  # what the server did not answer after the load


def model_rows(got: Inputs) -> list[dict[str, Any]]:
    """Per model: the answers' row, the server's counters, its memory (the largest
    /v1/models showed while resident; else the calibration's cost of its kind)."""
    described = {str(m["id"]): m for m in got.models if "parent" not in m}
    counted = state.counters(got.metrics, described)
    largest = state.largest_memory(got.polls)
    rows = accounting.rows([e.name for e in got.entries], got.answers)
    for row, entry in zip(rows, got.entries, strict=True):
        host = largest.get(entry.name, 0)
        row.update(
            kind=entry.kind.tag,
            **counted.get(entry.name, {}),
            memory_mb=host / MB if host else None,
            calibrated_mb=got.per_kind.get(entry.kind, 0) / MB,
        )
    return rows


def verdict(
    rows: Sequence[dict[str, Any]], mem: dict[str, Any], unread: Sequence[str] = ()
) -> list[str]:
    """Why the run fails; empty when it passes."""
    why = [f"after the load the server did not answer {u}" for u in unread]
    wrong = sum(r["answers"].get(accounting.WRONG, 0) for r in rows)
    errors = sum(r["errors"] for r in rows) - wrong
    if wrong:
        why.append(f"{wrong} answers with other vectors than the model's")
    if errors:
        why.append(f"{errors} errors other than 503 with Retry-After")
    if not mem["ok"]:
        why.append(
            f"the resident set reached {mem['max_mb']:.0f} MB, above its bound of "
            f"{mem['limit_mb']:.0f} MB (floor + budget + libraries + tolerance), "
            f"first at {mem['first_over_at_s']} s"
        )
    if not any(r["correct"] for r in rows):
        why.append("no request was answered correctly")
    return why


def result(got: Inputs) -> dict[str, Any]:
    rows = model_rows(got)
    mem = memory.verdict(got.samples, got.bound, since_s=got.load_at_s)
    names = [e.name for e in got.entries]
    held = [p.held_of(names) for p in got.polls]
    why = verdict(rows, mem, got.unread)
    return {
        "benchmark": "fleet",
        "ok": not why,
        "failed_because": why,
        "machine": got.machine,
        "cpu": got.cpu,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(got.args).items()},
        "fleet": [
            {"name": e.name, "kind": e.kind.tag, "runtime": e.kind.runtime, "dtype": e.kind.dtype}
            for e in got.entries
        ],
        "load": {
            **asdict(got.shape),
            "inputs": list(got.shape.inputs),
            "deadline_ms": got.args.deadline_ms,
            "clients": "open-loop, Poisson",
        },
        "budget_mb": got.bound.budget / MB,
        "budget_from": got.budget_source,
        "server_budget_mb": got.server_budget / MB,
        "planned_budget_mb": got.planned_budget / MB,
        "pinned": list(got.pinned),
        "calibration": got.calibration,
        "memory": mem,
        "host_held_max_mb": max(held) / MB if held else None,
        "host_held_over_budget_polls": sum(h > got.bound.budget for h in held),
        "totals": accounting.totals(got.answers),
        "models": rows,
        "failures": accounting.failures(got.answers),
        "min_cosine": check.MIN_COSINE,
        "timeline": timeline(got),
        "elapsed_s": got.elapsed_s,
    }


def timeline(got: Inputs) -> dict[str, Any]:
    """What the chart draws, on the load's clock: the resident set, the host's held
    memory and resident models per poll, and each answer (model, sent, latency, outcome)."""
    at = got.load_at_s
    names = [e.name for e in got.entries]
    return {
        "rss_mb": [[round(s.at_s - at, 2), round(s.rss / MB, 1)] for s in got.samples],
        "polls": [
            [round(p.at_s, 2), round(p.held_of(names) / MB, 1), p.resident] for p in got.polls
        ],
        "answers": [
            [a.model, round(a.at_s, 3), round(a.latency_ms, 1), a.outcome] for a in got.answers
        ],
    }


HEADERS = ["model", "kind", "requests", "correct", "503", "errors", "p50 ms", "p99 ms",
           "loads", "failed", "evictions", "mean load s", "memory MB"]  # fmt: skip


def markdown(data: dict[str, Any]) -> str:
    """The per-model table, and the memory line under it."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for r in data["models"]:
        memory_cell = _cell(r.get("memory_mb"))
        if r.get("memory_mb") is None:  # never seen resident: its kind's calibrated cost
            memory_cell = _cell(r.get("calibrated_mb")) + "*"
        cells = [r["model"], r["kind"], r["requests"], r["correct"], r["refused"], r["errors"],
                 r["p50_ms"], r["p99_ms"], r.get("loads"), r.get("failed_loads"),
                 r.get("evictions"),
                 r.get("mean_load_s")]  # fmt: skip
        lines.append("| " + " | ".join([*(_cell(c) for c in cells), memory_cell]) + " |")
    m = data["memory"]
    lines.append("")
    lines.append(
        "loads: completed loads; failed: loads that failed (one too large for the budget "
        "once measured is unloaded and failed); memory MB: the most /v1/models showed while "
        "the model was resident (what its last load added to the resident set); * its "
        "kind's calibrated cost, never seen resident."
    )
    lines.append("")
    lines.append(
        f"Resident set: floor {m['floor_mb']:.0f} MB, max {m['max_mb']:.0f} MB "
        f"(+{m['max_over_floor_mb']:.0f} MB); budget {m['budget_mb']:.0f} MB + libraries "
        f"{m['libraries_mb']:.0f} MB + tolerance {m['tolerance_mb']:.0f} MB "
        f"({m['tolerance']}): bound {m['limit_mb']:.0f} MB, {m['samples']} samples every "
        f"{m['period_s']:g} s."
    )
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def verdict_text(data: dict[str, Any]) -> str:
    if data["ok"]:
        t = data["totals"]
        return (
            f"ok: {t['correct']} of {t['requests']} requests answered correctly, "
            f"{t['refused']} refused with Retry-After, none wrong or failed; memory within "
            "its bound"
        )
    lines = ["FAILED: " + "; ".join(data["failed_because"])]
    for outcome, messages in data["failures"].items():
        lines += [f"  {outcome}: {m}" for m in messages]
    return "\n".join(lines)


def write(data: dict[str, Any], out_dir: Path, name: str) -> list[Path]:
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json_text(data), encoding="utf-8")
    md_path = out_dir / f"{name}.md"
    md_path.write_text(markdown(data) + "\n\n" + verdict_text(data) + "\n", encoding="utf-8")
    import bench.fleet.chart as chart

    png_path = out_dir / f"{name}.png"
    chart.plot(data, png_path)
    return [json_path, md_path, png_path]
