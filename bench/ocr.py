"""OCR benchmark: accuracy and throughput on a labelled page set, in one run.

The pages (``bench.ocr_data.pageset``, deterministic from ``--seed``): German
law sections and English prose drawn with ten fonts from Debian's packages at
18-30 px, clean, rotated a few degrees, with Gaussian noise, blurred or saved
as a poor JPEG, plus receipts and two-column pages. Sides, in one run:

- ``rapidocr``: ``RapidOCR()`` in this process, one image at a time (its own
  pipeline, as its README runs it);
- ``flotilla``: ``flotilla serve`` with an OCR fleet entry (``--flotilla-model``,
  else the fleet's first with task ``ocr``), ``--clients`` closed-loop clients
  posting ``/v1/ocr`` in Mistral's shape; skipped with the reason when the
  fleet has none.

Every level sends each page ``--rounds`` times. Per side and level: pages/s,
latency p50/p99 and the character error rate (``bench.ocr_data.score``) of
each page's first answer, per language, condition, layout, font and size.
JSON and the tables to ``bench/results/``, with the machine.

    flotilla bench ocr [--pages 48] [--clients 1,8,16] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import report
from bench.generation.flotilla_side import SkipSide
from bench.ocr_data import fonts, pageset
from bench.ocr_data.pageset import Sample
from bench.ocr_sides import client, flotilla_side, rapidocr_side
from bench.ocr_sides.results import summarize

SIDES = ("rapidocr", "flotilla")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="flotilla bench ocr",
        description="OCR pages/s, latency and character error rate: flotilla serve under "
        "concurrent clients against rapidocr's own pipeline one image at a time.",
    )
    parser.add_argument("--pages", type=int, default=48, help="pages in the set")
    parser.add_argument("--seed", type=int, default=0, help="the page set's seed")
    parser.add_argument(
        "--gesetze",
        type=Path,
        default=pageset.DEFAULT_GESETZE,
        help="folder of the German laws (gesetze/*.md) the German pages quote",
    )
    parser.add_argument("--clients", type=report.levels, default=[1, 8, 16], help="flotilla levels")
    parser.add_argument("--rounds", type=int, default=1, help="times each page is sent per level")
    parser.add_argument(
        "--sides", type=report.sides_of(SIDES), default=list(SIDES), help=", ".join(SIDES)
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--warmup", type=int, default=2, help="pages before each side, untimed")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per request")
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument("--flotilla-model", default=None, help="the fleet entry (task: ocr)")
    parser.add_argument("--flotilla-fleet", type=Path, default=None, help="its fleet file")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 12 pages (every condition in both languages), clients 1,4, "
        "one warm-up page",
    )
    parser.add_argument("--save-pages", type=Path, default=None, help="also write the set here")
    parser.add_argument(
        "--wait-quiet-s",
        type=float,
        default=0.0,
        help="on a shared machine, wait up to this long before each side for others to go quiet",
    )
    parser.add_argument("--out", default="ocr", help="results file stem in bench/results/")
    args = parser.parse_args(argv)
    if args.quick:
        args.pages, args.clients, args.warmup = 12, [1, 4], 1
    if min(args.pages, args.rounds, args.threads) <= 0 or args.warmup < 0:
        parser.error("--pages, --rounds and --threads must be positive, --warmup not negative")
    return args


def run_rapidocr(args: argparse.Namespace, samples: Sequence[Sample]) -> dict[str, Any]:
    ocr = rapidocr_side.engine(args.threads)
    rapidocr_side.run(ocr, samples, args.warmup)
    if args.wait_quiet_s > 0:
        report.wait_for_quiet(args.wait_quiet_s)
    meter = report.CpuMeter()
    row = summarize(
        "rapidocr", 1, rapidocr_side.run(ocr, samples, args.rounds * len(samples)), samples
    )
    row["cpu"] = meter.result()
    _print_row(row)
    return row


def run_flotilla(args: argparse.Namespace, samples: Sequence[Sample]) -> list[dict[str, Any]]:
    side = flotilla_side.FlotillaSide(
        args.flotilla_model, args.flotilla_fleet, args.threads, args.ready_timeout_s
    )
    log_path = report.results_dir() / f"{args.out}-flotilla.log"
    rows: list[dict[str, Any]] = []
    with flotilla_side.serve(side, log_path) as served:
        warm = asyncio.run(
            client.run_level(served.url, served.model, samples, 1, args.warmup, args.timeout_s)
        )
        failed = [o.error for o in warm if o.error]
        if failed:
            raise RuntimeError(f"flotilla: the warm-up failed: {failed[0]}")
        for clients in args.clients:
            if args.wait_quiet_s > 0:
                report.wait_for_quiet(args.wait_quiet_s)
            meter = report.CpuMeter([served.pid])
            outcomes = asyncio.run(
                client.run_level(
                    served.url,
                    served.model,
                    samples,
                    clients,
                    args.rounds * len(samples),
                    args.timeout_s,
                )
            )
            row = summarize("flotilla", clients, outcomes, samples)
            row["model"] = served.model
            row["cpu"] = meter.result()
            rows.append(row)
            _print_row(row)
    return rows


def _print_row(row: dict[str, Any]) -> None:
    cer = row["cer"]["all"]
    print(
        f"  {row['side']} x{row['clients']}: {row['pages_per_s']:.2f} pages/s, latency p50 "
        f"{row['latency_ms']['p50']:.0f} ms p99 {row['latency_ms']['p99']:.0f} ms, CER "
        f"{100 * cer['cer']:.2f}% (lines {100 * cer['line_cer']:.2f}%), "
        f"{row['ok']}/{row['requests']} ok"
    )


def _pct(cell: dict[str, Any] | None, key: str = "cer") -> str:
    return "-" if cell is None else f"{100 * cell[key]:.2f}%"


def _pair(cell: dict[str, Any] | None) -> str:
    return f"{_pct(cell)} / {_pct(cell, 'line_cer')}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    return report.table(
        [
            "side",
            "clients",
            "ok",
            "pages/s",
            "x rapidocr",
            "p50 ms",
            "p99 ms",
            "CER de",
            "CER en",
            "CER",
            "line CER",
            "others' CPU",
        ],
        [
            [
                r["side"],
                r["clients"],
                f"{r['ok']}/{r['requests']}",
                r["pages_per_s"],
                r["x_rapidocr"] if r["x_rapidocr"] is not None else float("nan"),
                r["latency_ms"]["p50"],
                r["latency_ms"]["p99"],
                _pct(r["cer"]["language"].get("de")),
                _pct(r["cer"]["language"].get("en")),
                _pct(r["cer"]["all"]),
                _pct(r["cer"]["all"], "line_cer"),
                f"{100 * r['cpu'].get('others_share', 0):.0f}%",
            ]
            for r in rows
        ],
    )


def cer_table(rows: Sequence[dict[str, Any]], group: str) -> str:
    """CER (reading order / lines) per value of ``group``, a column per side at its
    first level."""
    firsts = [
        r for r in rows if r["clients"] == min(x["clients"] for x in rows if x["side"] == r["side"])
    ]
    keys = sorted({k for r in firsts for k in r["cer"][group]})
    return report.table(
        [group, "pages", *(f"{r['side']} CER / lines" for r in firsts)],
        [
            [
                key,
                max(r["cer"][group].get(key, {}).get("pages", 0) for r in firsts),
                *(_pair(r["cer"][group].get(key)) for r in firsts),
            ]
            for key in keys
        ],
    )


def describe(samples: Sequence[Sample]) -> dict[str, Any]:
    return {
        "pages": len(samples),
        "chars": sum(len(s.text) for s in samples),
        "lines": sum(len(s.lines) for s in samples),
        "by_language": dict(Counter(s.language for s in samples)),
        "by_condition": dict(Counter(s.condition for s in samples)),
        "by_layout": dict(Counter(s.layout for s in samples)),
        "by_font": dict(Counter(s.font for s in samples)),
        "font_packages": {p.name: p.version for p in fonts.PACKAGES.values()},
        "pixels_mean": sum(s.width * s.height for s in samples) / max(1, len(samples)),
        "ids": [s.id for s in samples],
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the server this started is stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.perf_counter()
    samples = pageset.build(args.pages, args.seed, args.gesetze)
    print(f"{len(samples)} pages rendered in {time.perf_counter() - started:.1f} s")
    if args.save_pages is not None:
        print(f"wrote {pageset.save(samples, args.save_pages)}")
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    if "rapidocr" in args.sides:
        print("rapidocr: one image at a time")
        rows.append(run_rapidocr(args, samples))
    if "flotilla" in args.sides:
        print(f"flotilla: {list(args.clients)} clients")
        try:
            rows.extend(run_flotilla(args, samples))
        except SkipSide as exc:
            skipped["flotilla"] = str(exc)
            print(f"skipped flotilla: {exc}")
    base = next((r["pages_per_s"] for r in rows if r["side"] == "rapidocr"), None)
    for row in rows:
        row["x_rapidocr"] = row["pages_per_s"] / base if base else None
    machine = report.machine(args.threads)
    for dist in ("onnxruntime", "rapidocr-onnxruntime", "opencv-python-headless", "pillow"):
        machine[dist] = _version(dist)
    result: dict[str, Any] = {
        "benchmark": "ocr",
        "machine": machine,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "set": describe(samples),
        "rows": rows,
        "skipped": skipped,
    }
    text = (
        "\n\n".join(
            [
                table(rows),
                *(cer_table(rows, g) for g in ("language", "condition", "layout", "font")),
            ]
        )
        if rows
        else "no side ran"
    )
    print()
    print(text)
    (report.results_dir() / f"{args.out}.txt").write_text(text + "\n", encoding="utf-8")
    path = report.write_json(f"{args.out}.json", result)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
