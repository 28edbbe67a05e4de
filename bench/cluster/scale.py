"""Push against pull at cluster scale: real worker processes on emulated devices, under
the conditions of a real fleet.

Every worker is a real flotilla process (``ModelHost`` -> ``Worker``: pull what fits the
token budget, form the batch, run it) on the emulated device (``embedder.tasks.embed.
runtimes.emulated``: the real tokenizer, a forward that sleeps for the cost a device
profile gives it, ``bench.cluster.emulation``), one thread each and no torch, so dozens
fit on a 2-core machine. For each workload (``scale_load``: small requests, three device
generations, 16 models of shifting popularity on subsets of the workers, sharp bursts;
every request with a deadline of its latency class) the same workers and the same
open-loop requests go

- through the pull queue (``--pull``, a stack of ``scale_stacks.PULL_STACKS``) behind K
  gateways, and
- through K independent push routers (``bench.cluster.router``) per ``--policies``
  policy, each counting its own sends and polling on its own phase, with the hosting map
  where workers host subsets;

with K from ``--gateways`` and the requests spread over the K entry points. Each mode
searches for its highest load within the p99 target by bisection (``scale_search``),
the modes interleaved run by run (``scale_runs``), over ``--seeds`` seeds. Each run
records throughput, latency, errors (504s past the deadline included), every worker's
device busy fraction and the CPU of every host role. Every device cost is multiplied by
``scale``, chosen so that the cluster's capacity is at most ``--max-host-rps``
requests/s; the routers' view is stale in device time (``--refresh-ms`` and
``--report-delay-ms`` times ``scale``), so "R = 50 ms on a real GPU" stays 50 ms of the
emulated GPU's time. Tables, JSON and PNG are ``scale_report``'s.

    python -m bench.cluster.scale [--quick] [--workers N] [--device gpu-fixed|cpu|gpu-like]
        [--workloads small,hetero,manymodels,bursty] [--gateways 1,4,8] [--seeds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import report
from bench.cluster.cost_model import CostModel
from bench.cluster.emulation import DEVICES, Device, device_cost, generations, hosting_map
from bench.cluster.policies import VIEW_POLICIES
from bench.cluster.processes import Children
from bench.cluster.router import POLICIES
from bench.cluster.scale_load import HOSTED_PER_WORKER, WORKLOADS, build, cluster_rate, models_of
from bench.cluster.scale_report import TARGET_UNITS, beside_simulated, plot, summarize, tables
from bench.cluster.scale_runs import Cluster, Mode, measure_workload
from bench.cluster.scale_search import HIGH, LOW
from bench.cluster.scale_stacks import (
    PULL_STACKS,
    Devices,
    PullStack,
    View,
    start_push,
    start_routers,
)
from bench.cluster.scale_traffic import BURST_OF_TARGET, LATENCY_CLASSES, lane_bounds_ms

DEFAULT_WORKERS = {"gpu-fixed": 8, "cpu": 16, "gpu-like": 16}
N_PROBE = 2000  # requests of the probe workload that sizes the scale


def devices_for(workload: str, workers: int, cost: CostModel) -> Devices:
    """hetero: three device generations; manymodels: each worker a few of the 16 models."""
    slow = generations(workers) if workload == "hetero" else [1.0] * workers
    models = models_of(workload)
    per = HOSTED_PER_WORKER if len(models) > 1 else len(models)
    return Devices(
        workload, [Device(cost, s) for s in slow], hosting_map(workers, models, per), models
    )


def choose_scale(args: argparse.Namespace, n: int) -> float:
    """Every device's cost multiplier: the cluster's capacity on small requests at most
    ``--max-host-rps`` (the host path's budget on this machine), never faster than measured."""
    if args.scale:
        return float(args.scale)
    base = device_cost(args.device)
    probe = build("small", N_PROBE, base, args.seed).workload
    return max(1.0, cluster_rate(probe, base, [1.0] * n) / float(args.max_host_rps))


def push_modes(args: argparse.Namespace) -> list[Mode]:
    """Every push policy; one whose router reads the workers' load once per refresh."""
    modes: list[Mode] = []
    for policy in args.policies:
        if policy in VIEW_POLICIES:
            modes += [Mode(f"push {policy} R={r:g}ms", policy, r) for r in args.refresh_ms]
        else:
            modes.append(Mode(f"push {policy}", policy))
    return modes


def default_target_ms(cost: CostModel, mean_tokens: float) -> float:
    """TARGET_UNITS times one mean request alone on a full-speed device (wall time)."""
    return TARGET_UNITS * 1e3 * (cost.fixed_s + cost.per_token_s * mean_tokens)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from embedder.tasks.fleet import load_fleet

    started = time.perf_counter()
    spec = load_fleet().get("all-minilm-l6-v2")
    scale = choose_scale(args, args.workers)
    cost = device_cost(args.device, scale)
    probe = build("small", N_PROBE, cost, args.seed)
    target_ms = args.p99_ms or default_target_ms(cost, sum(probe.tokens) / len(probe.tokens))
    longest_s = max(c.of_target for c in LATENCY_CLASSES) * target_ms / 1e3
    args.request_timeout_s = max(args.request_timeout_s, 1.5 * longest_s)
    args.lanes_ms = lane_bounds_ms(target_ms) if args.lanes == "deadline" else []
    out_dir = args.out_dir or report.results_dir()
    logs = out_dir / f"{args.out}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in [*logs.glob("*.log"), *logs.glob("*.yaml")]:
        old.unlink()
    stack = PULL_STACKS[args.pull]()
    machine = report.machine(1)
    print(f"host: {machine['cpu']}, {machine['cores']} cores")
    print(f"{args.workers} workers a side, device {cost.label}; pull through {stack.name}")
    print(
        f"p99 target {target_ms:,.0f} ms; view R {args.refresh_ms} ms device time = "
        f"{[round(r * scale) for r in args.refresh_ms]} ms wall"
    )
    runs: list[dict[str, Any]] = []
    workload_info: dict[str, Any] = {}
    env = {"HF_HUB_OFFLINE": "1", "FLOTILLA_AUTO_TRUNCATE": "true"}
    with contextlib.ExitStack() as stack_ctx:
        data_dir = Path(stack_ctx.enter_context(tempfile.TemporaryDirectory(prefix="flotilla-cs-")))
        stack_ctx.callback(stack.stop)
        children = stack_ctx.enter_context(Children(logs, env))
        for name in args.workloads:
            info, workload_runs = run_workload(
                name, args, children, stack, spec, cost, data_dir, target_ms
            )
            workload_info[name] = info
            runs += workload_runs
    return {
        "benchmark": "cluster_scale",
        "machine": machine,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "device": {
            "label": cost.label,
            "source": cost.source,
            "scale": scale,
            "fixed_ms": 1e3 * cost.fixed_s,
            "us_per_token": 1e6 * cost.per_token_s,
            "refresh_ms_device": args.refresh_ms,
            "refresh_ms_wall": [r * scale for r in args.refresh_ms],
            "report_delay_ms_device": args.report_delay_ms,
            "report_delay_ms_wall": args.report_delay_ms * scale,
        },
        "latency_classes": [vars(c) for c in LATENCY_CLASSES],
        "pull_stack": stack.name,
        "workloads": workload_info,
        "runs": runs,
        "elapsed_s": time.perf_counter() - started,
    }


def workload_info(
    name: str, args: argparse.Namespace, cost: CostModel, devices: Devices, target_ms: float
) -> dict[str, Any]:
    """What the workload and its devices are: capacity, devices, hosting, the latency unit
    (the lists a simulation of the same fleet takes: slowdowns, hosting)."""
    slow = [d.slowdown for d in devices.devices]
    probe = build("small", N_PROBE, cost, args.seed)
    full = cluster_rate(probe.workload, cost, slow)
    mean_tokens = sum(probe.tokens) / len(probe.tokens)
    return {
        "capacity_rps": full,
        "slowdowns": slow,
        "models": list(devices.models),
        "hosting": devices.hosting,
        "mean_tokens": mean_tokens,
        # One mean request alone on a full-speed device: the latency unit.
        "single_request_s": cost.fixed_s + cost.per_token_s * mean_tokens,
        "p99_target_ms": target_ms,
        "shift_s": args.shift_s if name == "manymodels" else None,
        "burst_s": BURST_OF_TARGET * target_ms / 1e3 if name == "bursty" else None,
        # Enough requests for the highest load the bisection can try, bursts included.
        "n_requests": math.ceil(1.2 * args.loads[1] * full * (args.duration_s + 1)) + 100,
    }


def run_workload(
    name: str,
    args: argparse.Namespace,
    children: Children,
    stack: PullStack,
    spec: Any,
    cost: CostModel,
    data_dir: Path,
    target_ms: float,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One workload with both sides up at once: what it is, and every run's result."""
    devices = devices_for(name, args.workers, cost)
    info = workload_info(name, args, cost, devices, target_ms)
    requests = [
        build(
            name,
            info["n_requests"],
            cost,
            args.seed + i,
            shift_s=args.shift_s,
            burst_s=info["burst_s"] or 0.0,
        )
        for i in range(args.seeds)
    ]
    print(
        f"\n{name}: cluster capacity {info['capacity_rps']:,.1f} req/s; "
        f"{len(devices.models)} models",
        flush=True,
    )
    modes = push_modes(args)
    if devices.subsets and not stack.serves_subsets:
        info["pull"] = (
            f"not run: the {stack.name} queue cannot pull by model (every worker "
            "of its group must host every model)"
        )
        print(f"  pull skipped: {info['pull']}")
    else:
        modes.append(Mode(f"pull ({stack.name})"))
    push = start_push(args, children, spec, devices, data_dir)
    pull = (
        None if "pull" in info else stack.start(args, children, spec, devices, max(args.gateways))
    )
    scale = cost.scale
    routers = {
        m.name: start_routers(
            children,
            push,
            devices,
            m.policy,
            _view(m, args, scale),
            max(args.gateways),
            args.seed,
        )
        for m in modes
        if m.policy is not None
    }
    cluster = Cluster(children, devices, push, pull, routers, info["capacity_rps"], target_ms, args)
    try:
        info["searches"] = asyncio.run(measure_workload(cluster, modes, requests))
    finally:
        every = [r for rs in routers.values() for r in rs]
        for child in every:
            child.proc.terminate()  # all at once: each takes its grace period in parallel
        for child in every:
            child.stop()
        for side in (push, pull):
            if side is not None:
                side.stop()
    return info, cluster.runs


def _view(mode: Mode, args: argparse.Namespace, scale: float) -> View | None:
    """The mode's view in wall time: device time times the devices' scale."""
    if mode.refresh_ms is None:
        return None
    return View(mode.refresh_ms * scale, args.report_delay_ms * scale)


def _floats(value: str) -> list[float]:
    values = [float(v) for v in value.split(",") if v.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("give positive numbers, comma-separated")
    return values


def _bracket(value: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError("give LOW-HIGH, like 0.1-0.5") from None
    if not 0 < low < high:
        raise argparse.ArgumentTypeError("need 0 < LOW < HIGH")
    return low, high


def _names(allowed: Sequence[str]) -> Any:
    def parse(value: str) -> list[str]:
        names = [v.strip() for v in value.split(",") if v.strip()]
        if not names or any(n not in allowed for n in names):
            raise argparse.ArgumentTypeError(f"choose among {', '.join(allowed)}")
        return names

    return parse


def _ints(value: str) -> list[int]:
    values = [int(v) for v in value.split(",") if v.strip()]
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("give positive integers, comma-separated")
    return values


QUICK = {
    "duration_s": 6.0,
    "steps": 2,
    "seeds": 1,
    "gateways": [1],
    "policies": ["rr", "least+own"],
    "workloads": ["hetero", "manymodels"],
    "shift_s": 2.0,
}


def _add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes a side (default: 8 on gpu-fixed, else 16)",
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="gpu-fixed",
        help="gpu-fixed: a GPU whose fixed cost per pass dominates; cpu: this machine's "
        "measured fit; gpu-like: that fit scaled (both gpu profiles HYPOTHETICAL)",
    )
    p.add_argument(
        "--scale",
        type=float,
        default=None,
        help="every device cost times this; default: from --max-host-rps",
    )
    p.add_argument(
        "--max-host-rps",
        type=float,
        default=160.0,
        help="the cluster's capacity in small requests/s that the devices are "
        "slowed to: what this machine's host path carries in under half its cores",
    )


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", type=_names(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--policies", type=_names(list(POLICIES)), default=["rr", "least", "least+own"])
    p.add_argument(
        "--gateways",
        type=_ints,
        default=[1],
        help="K: gateways (pull) and routers per push mode; a list runs each (1)",
    )
    p.add_argument(
        "--refresh-ms",
        type=_floats,
        default=[50.0],
        help="R of the routers' view, in device time (50)",
    )
    p.add_argument(
        "--report-delay-ms",
        type=float,
        default=0.0,
        help="the view is this old when a router applies it, in device time (0)",
    )
    p.add_argument("--duration-s", type=float, default=60.0, help="per run (60)")
    p.add_argument("--seeds", type=int, default=3, help="request sequences per load (3)")
    p.add_argument("--steps", type=int, default=5, help="bisection steps per mode (5)")
    p.add_argument(
        "--loads",
        type=_bracket,
        default=(LOW, HIGH),
        metavar="LOW-HIGH",
        help=f"the offered loads the bisection searches, fractions of capacity ({LOW}-{HIGH}); "
        "its resolution is (HIGH - LOW) / 2**steps, the same for every mode",
    )
    p.add_argument(
        "--shift-s",
        type=float,
        default=15.0,
        help="manymodels: the popularity ranking rotates this often (15 s)",
    )
    p.add_argument(
        "--p99-ms",
        type=float,
        default=None,
        help="the p99 target in wall ms; default 10x one mean request alone on a full-speed device",
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.cluster.scale",
        description="Push against pull with real worker processes on emulated devices.",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    _add_device_args(p)
    _add_run_args(p)
    p.add_argument("--pull", choices=sorted(PULL_STACKS), default="jetstream")
    p.add_argument(
        "--lanes",
        choices=["deadline", "none"],
        default="deadline",
        help="pull's queues: 'deadline' splits each model's into a lane per latency class "
        "(--nats-deadline-lanes-ms between their deadlines); 'none' keeps one per model, "
        "in arrival order (deadline)",
    )
    p.add_argument("--nats", default=None, help="an existing nats-server; else one is started")
    p.add_argument("--seed", type=int, default=20261129)
    p.add_argument(
        "--request-timeout-s",
        type=float,
        default=30.0,
        help="the processes' deadline; raised to 1.5x the longest class's",
    )
    p.add_argument("--ready-timeout-s", type=float, default=240.0)
    p.add_argument("--summarize", type=Path, default=None, metavar="JSON")
    p.add_argument(
        "--simulated",
        type=Path,
        default=None,
        metavar="JSON",
        help="the simulation's max loads per workload (bench.cluster.scale_ideal's form) "
        "to print beside the measured ones; by default the run's fleet is simulated",
    )
    p.add_argument("--out", default="cluster_scale")
    p.add_argument("--out-dir", type=Path, default=None)
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    args.workers = args.workers or DEFAULT_WORKERS[args.device]
    if not 1 <= args.workers <= 64:
        p.error("--workers must be in 1..64")
    if args.seeds < 1 or args.steps < 1 or args.report_delay_ms < 0:
        p.error("--seeds and --steps must be at least 1, --report-delay-ms not negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize is not None:
        data = json.loads(args.summarize.read_text(encoding="utf-8"))
    else:
        data = run(args)
    data["summary"] = summarize(data, args.p99_ms)
    print()
    print(tables(data))
    if args.simulated is not None:
        data["simulated"] = json.loads(args.simulated.read_text(encoding="utf-8"))
    elif "simulated" not in data and "args" in data:  # the same fleet, simulated
        from bench.cluster.scale_ideal import simulate_run

        data["simulated"] = simulate_run(data)
    print("\n" + beside_simulated(data["summary"], data.get("simulated")))
    out_dir = args.out_dir or report.results_dir()
    path = out_dir / f"{args.out}.json"
    path.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    png = out_dir / f"{args.out}.png"
    plot(data, png)
    print(f"\nwrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
