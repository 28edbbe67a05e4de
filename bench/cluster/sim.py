"""The simulated study's command line: ``flotilla bench cluster`` without ``--real``.

Builds a ``Plan`` from the options, runs it (``bench.cluster.experiments``), prints
the tables and writes the JSON and the plots (``bench.cluster.sim_report``).

    python -m bench.cluster.sim [--workers 8 16 32 64] [--staleness-ms 0 5 20 50 100 200]
        [--workload small mixed bursty multimodel] [--p99-batches 2 4 | --p99-ms MS ...]
        [--routers 1 4] [--cost cpu | --cost gpu-like --gpu-speedup 100] [--quick]
        [--slowdowns gens3 | 1,2,4] [--models 16 --models-per-worker 2-4] [--pace pull]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from bench import report
from bench.cluster.cost_model import GPU_FIXED_FACTOR, GPU_PER_TOKEN_DIVISOR, gpu_like, load_cost
from bench.cluster.experiments import Plan, run_plan
from bench.cluster.fleet import PACES, PROFILES
from bench.cluster.policies import PUSH
from bench.cluster.sim_report import json_text, plots, tables
from bench.cluster.workloads import SEED, WORKLOADS


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster.sim",
        description="Push versus pull: throughput at a p99 latency target, simulated.",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="default 8 16 32 64")
    parser.add_argument(
        "--staleness-ms", type=float, nargs="+", default=None, help="default 0 5 20 50 100 200"
    )
    parser.add_argument("--workload", nargs="+", choices=WORKLOADS, default=None)
    parser.add_argument("--policy", nargs="+", choices=PUSH, default=None, help="push policies")
    parser.add_argument(
        "--p99-ms", type=float, nargs="+", default=None, help="p99 targets, the same for all"
    )
    parser.add_argument(
        "--p99-batches",
        type=float,
        nargs="+",
        default=[2.0, 4.0],
        help="p99 targets in full-batch times of each workload (when no --p99-ms)",
    )
    parser.add_argument(
        "--routers", type=int, nargs="+", default=[1], help="independent push routers, each a run"
    )
    parser.add_argument(
        "--slowdowns",
        default="",
        help=f"uneven devices: a profile ({', '.join(PROFILES)}: a third of the workers each "
        "at 1x, 2x, 4x) or factors like 1,2,4, each to an equal share of the workers",
    )
    parser.add_argument(
        "--models", type=int, default=0, help="spread the requests over N Zipf-popular models"
    )
    parser.add_argument(
        "--models-per-worker",
        default="",
        help="N or LOW-HIGH models per worker (default: every model everywhere); replicas "
        "follow each model's popularity",
    )
    parser.add_argument(
        "--pace",
        choices=PACES,
        default=None,
        help="which workers take a batch they finish within half the p99 target at their own "
        "speed (default: pull's, when the slowdowns differ; else off)",
    )
    parser.add_argument(
        "--cost",
        choices=["cpu", "gpu-like"],
        default="cpu",
        help="cpu: the measured fit (bench/results/cluster_calibration.json, else the "
        "built-in fallback); gpu-like: HYPOTHETICAL scaling of it (see bench.cluster.cost_model)",
    )
    parser.add_argument(
        "--gpu-speedup",
        type=float,
        default=GPU_PER_TOKEN_DIVISOR,
        help="gpu-like: the measured per-token cost divided by this (HYPOTHETICAL)",
    )
    parser.add_argument(
        "--gpu-fixed-factor",
        type=float,
        default=GPU_FIXED_FACTOR,
        help="gpu-like: the measured fixed per-batch cost times this (HYPOTHETICAL)",
    )
    parser.add_argument("--calibration", type=Path, default=None, help="a calibration JSON")
    parser.add_argument("--batches", type=float, default=None, help="simulated full-batch times")
    parser.add_argument("--max-requests", type=int, default=None, help="per simulation")
    parser.add_argument("--sweep-workers", type=int, default=None)
    parser.add_argument("--sweep-staleness-ms", type=float, default=50.0)
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="a small grid in seconds")
    parser.add_argument("--out", default="cluster_sim", help="name of the JSON and PNG files")
    parser.add_argument("--out-dir", type=Path, default=None, help="default bench/results")
    return parser.parse_args(argv)


def plan_from(args: argparse.Namespace) -> Plan:
    cost = load_cost(args.calibration)
    if args.cost == "gpu-like":
        cost = gpu_like(cost, args.gpu_speedup, args.gpu_fixed_factor)
    quick = args.quick
    workers = tuple(args.workers or ((8, 16) if quick else (8, 16, 32, 64)))
    default_staleness = (0.0, 20.0, 100.0) if quick else (0.0, 5.0, 20.0, 50.0, 100.0, 200.0)
    loads = (0.3, 0.6, 0.8, 0.9) if quick else (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    return Plan(
        cost=cost,
        workloads=tuple(args.workload or WORKLOADS),
        workers=workers,
        staleness_ms=tuple(args.staleness_ms or default_staleness),
        policies=("pull", *(args.policy or PUSH)),
        targets=tuple(args.p99_ms or args.p99_batches),
        target_unit="ms" if args.p99_ms else "batches",
        routers=tuple(args.routers),
        batches=args.batches or (8.0 if quick else 15.0),
        min_requests=2_000 if quick else 10_000,
        max_requests=args.max_requests or (20_000 if quick else 150_000),
        sweep_loads=() if args.no_sweep else loads,
        sweep_workers=args.sweep_workers or (32 if 32 in workers else max(workers)),
        sweep_staleness_ms=args.sweep_staleness_ms,
        seed=args.seed,
        slowdowns=args.slowdowns,
        models=args.models,
        models_per_worker=args.models_per_worker,
        pace=args.pace,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = plan_from(args)
    if plan.cost.source == "fallback":
        print(
            "  (no bench/results/cluster_calibration.json: run python -m bench.cluster.calibrate)"
        )
    data = run_plan(plan, args.jobs)
    print(tables(data))
    out_dir = args.out_dir or report.results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{args.out}.json"
    path.write_text(json_text(data), encoding="utf-8")
    written = [path, *plots(data, out_dir, args.out)]
    print(f"\n{data['elapsed_s']:.0f} s; wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
