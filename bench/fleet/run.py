"""``flotilla bench fleet``: a fleet wider than memory, served on one machine.

The fleet: ``--entries`` embedding entries made from the bundled weights (all-MiniLM-L6-v2
and multilingual-e5-small) under names of their own, with fixed runtimes and precisions
(torch fp32/bf16, ONNX Runtime fp32, OpenVINO fp32/bf16, where installed), every one
``load: on_demand`` and evictable (``bench.fleet.fleetfile``). Separate entries are
separate resident copies.

First a calibration server measures what one copy of each kind adds to the resident set
and what each runtime's libraries add once (``bench.fleet.calibrate``); the budget
(``--memory-budget-mb`` of the server) is set to hold ``--hold`` models of the fleet's
mean cost, or to ``--budget-mb``; ``--warm-runtimes`` pins one entry per runtime besides,
loaded at start, so that no on-demand load carries a runtime's libraries (the server's
budget grows by what they hold). Then a fresh server with that budget takes an open-loop
load (``bench.fleet.traffic``): Poisson arrivals at ``--rate``, each naming a model by a
Zipf popularity whose ranking rotates every ``--shift-s``, each with
``x-request-timeout-ms``. Every 200 is checked against the same weights loaded alone in
this process (``bench.fleet.check``); the server's resident set is sampled every 100 ms
(``bench.fleet.memory``); /v1/models is polled each second and /metrics read at the end
(``bench.fleet.state``).

The run fails (exit status 1, ``"ok": false``) on a wrong answer, on an error other than a
503 with Retry-After, or when the resident set rose above its floor by more than the
budget, the runtimes' libraries and the tolerance. JSON, a Markdown table and a PNG go to
``--out-dir`` (``bench.fleet.report``).

    flotilla bench fleet [--quick] [--warm-runtimes] [--entries 12] [--hold 3] [--duration-s 120]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

import bench.fleet.calibrate as calibrate
import bench.fleet.check as check
import bench.fleet.fleetfile as fleetfile
import bench.fleet.report as report
import bench.fleet.state as state
import bench.fleet.traffic as traffic
from bench import report as bench_report
from bench import texts as bench_texts
from bench.fleet.accounting import Answer
from bench.fleet.clients import Check, MinCosine, OpenLoop
from bench.fleet.fleetfile import Entry
from bench.fleet.memory import MB, Bound
from bench.fleet.server import Running, serving
from embedder.core.fleet import Fleet

QUICK = {"entries": 4, "hold": 2.0, "duration_s": 20.0, "shift_s": 5.0, "rate": 6.0}
FLOOR_S = 1.0  # the floor: the median resident set over this long before the load
KEEPALIVE_S = 2.0  # below the server's keep-alive, so the client closes an idle one first
CALIBRATION_DEADLINE_S = 900.0  # a kind's first load on a machine may export its graph


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="flotilla bench fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--quick", action="store_true",
        help="a smoke run, MiniLM kinds only; its defaults: " + str(QUICK))  # fmt: skip
    add("--entries", type=int, default=12, help="fleet entries (12)")
    add("--hold", type=float, default=3.0, help="models of mean cost the budget holds (3)")
    add("--budget-mb", type=float, default=None, help="the budget, instead of --hold's")
    add("--duration-s", type=float, default=120.0, help="the load (120)")
    add("--rate", type=float, default=8.0, help="requests per second, open-loop (8)")
    add("--shift-s", type=float, default=20.0, help="the ranking rotates this often (20)")
    add("--step", type=int, default=None,
        help="places it rotates by (default a quarter of the entries)")  # fmt: skip
    add("--zipf-s", type=float, default=1.2, help="the skew: rank r asked ∝ 1/r^s (1.2)")
    add("--deadline-ms", type=float, default=30_000.0, help="x-request-timeout-ms (30000)")
    add("--warm-runtimes", action="store_true",
        help="also pin one entry per runtime, loaded at start and never asked for, so the "
        "runtimes' libraries are in before the load (the server's budget grows by what "
        "those first loads held; the bound then counts from a floor that holds them)")  # fmt: skip
    add("--tolerance-pct", type=float, default=10.0,
        help="memory tolerance above the budget, percent of the budget (10)")  # fmt: skip
    add("--tolerance-mb", type=float, default=50.0, help="and in MB besides (50)")
    add("--threads", type=int, default=os.cpu_count() or 1)
    add("--seed", type=int, default=bench_texts.SEED)
    add("--ready-timeout-s", type=float, default=300.0)
    add("--out", default="fleet", help="name of the JSON, Markdown and PNG files")
    add("--out-dir", type=Path, default=None, help="default bench/results")
    # --quick changes the defaults, so that a flag given beside it still wins.
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(**QUICK)
    args = parser.parse_args(argv)
    if args.entries < 2 or args.hold <= 0 or args.rate <= 0 or args.shift_s <= 0:
        parser.error("--entries must be 2 or more; --hold, --rate and --shift-s positive")
    if args.step is None:
        args.step = max(1, args.entries // 4)
    return args


@dataclass
class Setup:
    """What the run is made of, before any server starts."""

    entries: list[Entry]
    bundled: Fleet
    texts: list[str]
    refs: dict[str, check.References]  # per weights
    planned: list[traffic.Planned]
    shape: traffic.Shape


def prepare(args: argparse.Namespace) -> Setup:
    from embedder.tasks.fleet import load_fleet

    bundled = load_fleet()
    kinds = fleetfile.available(fleetfile.QUICK_KINDS if args.quick else fleetfile.KINDS)
    entries = fleetfile.entries(args.entries, kinds)
    texts = check.bench_texts(seed=args.seed)
    used = {e.kind.weights: fleetfile.WEIGHTS[e.kind.weights] for e in entries}
    print(f"references: {', '.join(used.values())} in fp32, alone, over {len(texts)} texts")
    refs = check.references_for(bundled, used, texts, args.threads)
    shape = traffic.Shape(args.duration_s, args.rate, args.shift_s, args.step, args.zipf_s)
    planned = traffic.plan([e.name for e in entries], shape, len(texts), args.seed)
    return Setup(entries, bundled, texts, refs, planned, shape)


def write_fleet(
    path: Path, chosen: Sequence[Entry], bundled: Fleet, pinned: Sequence[Entry] = ()
) -> Path:
    data = fleetfile.fleet_file(chosen, bundled, pinned)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def session(deadline_s: float) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=deadline_s + 15)
    # An open-loop load leaves connections idle between requests: kept longer than the
    # server keeps them (uvicorn: 5 s), one may be reused just as the server closes it,
    # and a POST on it fails with a reset that says nothing about the server.
    connector = aiohttp.TCPConnector(limit=1024, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(timeout=timeout, connector=connector)


def run_calibration(args: argparse.Namespace, setup: Setup, work: Path) -> list[calibrate.Measured]:
    kinds = [e.kind for e in setup.entries]
    entries = calibrate.plan(kinds)
    fleet = write_fleet(work / "calibration.yaml", entries, setup.bundled)
    print(f"calibration: {len(entries)} loads, one at a time (log: {work / 'calibration.log'})")

    async def measure(running: Running) -> list[calibrate.Measured]:
        async with session(CALIBRATION_DEADLINE_S) as s:
            return await calibrate.measure(
                s, running, entries, setup.texts[: calibrate.SERVE_TEXTS]
            )

    # No budget to speak of (0 is the server's automatic one, most of the free memory).
    with serving(fleet, 0, work, "calibration", threads=args.threads,
                 deadline_s=CALIBRATION_DEADLINE_S,
                 ready_timeout_s=args.ready_timeout_s) as running:  # fmt: skip
        return asyncio.run(measure(running))


@dataclass
class Drive:
    """What the measured server gave: the answers, the polls, the counters at the end,
    its floor and when the load began on the memory sampler's clock."""

    answers: list[Answer]
    polls: list[state.Seen]
    metrics: str
    models: list[dict[str, Any]]
    floor: int
    load_at_s: float
    cpu: dict[str, float]  # the machine's CPU over the load: ours, and other processes'
    unread: list[str]  # what the server did not answer after the load
    pinned_held: int  # what the entries loaded at start hold, by /v1/models


def judge(setup: Setup) -> tuple[Check, MinCosine]:
    """The check of a 200 and the bound of each model, by the entry's weights and dtype."""
    kinds = {e.name: e.kind for e in setup.entries}

    def worst(request: traffic.Planned, payload: bytes) -> float:
        refs = setup.refs[kinds[request.model].weights]
        return check.worst_cosine(check.answer_vectors(payload), request.inputs, refs)

    def bound(model: str) -> float:
        return check.min_cosine(kinds[model].dtype)

    return worst, bound


async def drive(args: argparse.Namespace, setup: Setup, running: Running) -> Drive:
    memory = running.memory
    await asyncio.sleep(FLOOR_S + 0.1)
    floor = memory.level(memory.now() - FLOOR_S)
    worst, bound = judge(setup)
    async with session(args.deadline_ms / 1e3) as s:
        # What the entries loaded at start hold, as the host counts it: the rest of its
        # budget is the on-demand entries' room.
        at_start = state.seen(0.0, await state.models(s, running.base))
        pinned_held = at_start.held_of(set(at_start.states) - {e.name for e in setup.entries})
        poller = state.Poller(s, running.base, time.monotonic())
        polling = asyncio.create_task(poller.run())
        load = OpenLoop(s, running.embeddings, setup.planned, setup.texts, worst, bound,
                        args.deadline_ms)  # fmt: skip
        load_at = memory.now()
        meter = bench_report.CpuMeter([running.pid])
        answers = await load.run()
        cpu = meter.result()
        poller.stop()
        polls = await polling
        metrics, models, unread = await state.after_run(s, running.base)
    return Drive(answers, polls, metrics, models, floor, load_at, cpu, unread, pinned_held)


@dataclass(frozen=True)
class Budget:
    """The budget the on-demand entries share (what the bound counts), the server's (with
    the pinned entries' room), the runtimes' libraries the bound allows for, and why."""

    on_demand: int
    server: int
    libraries: int
    pinned: list[Entry]
    source: str


def budget_for(
    args: argparse.Namespace, setup: Setup, measured: list[calibrate.Measured]
) -> Budget:
    per_kind, libraries = calibrate.costs(measured)
    costs = [per_kind[e.kind] for e in setup.entries]
    margin = calibrate.LARGEST_MARGIN
    source = f"{args.hold:g} x the fleet's mean cost, at least {margin:g} x its largest"
    on_demand = calibrate.choose_budget(costs, args.hold)
    if args.budget_mb:
        on_demand, source = int(args.budget_mb * MB), "--budget-mb"
    if not args.warm_runtimes:
        runtimes = {e.kind.runtime for e in setup.entries}
        return Budget(on_demand, on_demand, sum(libraries.get(r, 0) for r in runtimes), [], source)
    # The pinned entries hold their runtime's libraries and a model each: room of their own,
    # measured by the calibration's first load of each runtime.
    pinned = fleetfile.warmers([e.kind for e in setup.entries])
    first = calibrate.first_loads(measured)
    room = sum(first[w.kind.runtime] for w in pinned)
    source += f"; the server's budget adds {room / MB:.0f} MB for {len(pinned)} pinned entries"
    return Budget(on_demand, on_demand + room, 0, pinned, source)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    started = time.perf_counter()
    setup = prepare(args)
    measured = run_calibration(args, setup, work)
    budget = budget_for(args, setup, measured)
    fleet = write_fleet(work / "fleet.yaml", setup.entries, setup.bundled, budget.pinned)
    print(f"fleet: {len(setup.entries)} entries on demand, {len(budget.pinned)} pinned; budget "
          f"{budget.on_demand / MB:.0f} MB ({budget.source}); {len(setup.planned)} requests "
          f"over {args.duration_s:.0f} s (log: {work / 'fleet.log'})", flush=True)  # fmt: skip
    with serving(fleet, budget.server / MB, work, "fleet", threads=args.threads,
                 deadline_s=args.deadline_ms / 1e3,
                 ready_timeout_s=args.ready_timeout_s) as running:  # fmt: skip
        driven = asyncio.run(drive(args, setup, running))
    # With pinned entries the on-demand room is what the host left of its budget once they
    # loaded (their sizes as measured then, not as calibrated).
    room = budget.server - driven.pinned_held if budget.pinned else budget.on_demand
    bound = Bound(driven.floor, room, budget.libraries, args.tolerance_pct, args.tolerance_mb)
    return report.result(
        report.Inputs(
            args=args, entries=setup.entries, shape=setup.shape, answers=driven.answers,
            polls=driven.polls, metrics=driven.metrics, models=driven.models,
            samples=running.memory.samples, load_at_s=driven.load_at_s, bound=bound,
            calibration=calibrate.section(measured), per_kind=calibrate.costs(measured)[0],
            budget_source=budget.source, server_budget=budget.server,
            planned_budget=budget.on_demand,
            pinned=[e.name for e in budget.pinned],
            machine=bench_report.machine(args.threads), cpu=driven.cpu,
            elapsed_s=time.perf_counter() - started, unread=driven.unread,
        )
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out_dir = args.out_dir or bench_report.results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="flotilla-bench-fleet-"))
    try:
        data = run(args, work)
    finally:
        logs = out_dir / f"{args.out}-logs"
        logs.mkdir(exist_ok=True)
        for kept in [*work.glob("*.log"), *work.glob("*.yaml")]:
            shutil.copy(kept, logs / kept.name)
        shutil.rmtree(work, ignore_errors=True)
    paths = report.write(data, out_dir, args.out)
    print(report.markdown(data))
    print(report.verdict_text(data))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0 if data["ok"] else 1
