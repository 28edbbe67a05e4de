"""Push against pull at cluster scale: 16-64 real worker processes on emulated devices.

Every worker is a real flotilla process (``ModelHost`` -> ``Worker``: pull what fits the
token budget, form the batch, run it) on the emulated device (``embedder.tasks.embed.runtimes.
emulated``: the real tokenizer, a forward that sleeps for the cost a measured runtime's
fit gives it, ``bench.cluster.emulation``), one thread each and no torch, so dozens fit
on a 2-core machine. For each workload (``scale_load``: small requests, heterogeneous
devices, many models on subsets of the workers, bursts) the same workers and the same
open-loop requests at the same offered loads go

- through the pull queue (``--pull``, a stack of ``scale_stacks.PULL_STACKS``), and
- through the push router (``bench.cluster.router``) under each ``--policies`` policy,
  counting tokens, with the hosting map where workers host subsets.

Each run records throughput, latency, errors, every worker's device busy fraction (time
in forward over wall time, from its /metrics) and the CPU of every host role (client,
router, gateway, broker, workers' own host work). Offered loads are fractions of the
cluster's capacity; every device cost is multiplied by ``scale``, chosen so that the
cluster's capacity is at most ``--max-host-rps`` requests/s: slower devices so that the
host path of this machine can feed them (the report says whether it stayed under half
the cores). Tables, JSON and PNG are ``scale_report``'s.

    python -m bench.cluster.scale [--quick] [--workers 16] [--device cpu|gpu-like]
        [--workloads small,hetero,multimodel,bursty] [--loads 0.5,0.7,0.9,1.1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench import report
from bench.cluster import scale_report
from bench.cluster.emulation import (
    DEVICES,
    Device,
    busy_fractions,
    device_cost,
    forward_seconds,
    hosting_map,
    slowdowns,
)
from bench.cluster.processes import Child, Children
from bench.cluster.router import POLICIES
from bench.cluster.scale_load import (
    MODELS,
    MODELS_PER_WORKER,
    SLOW_FACTOR,
    SLOW_SHARE,
    WORKLOADS,
    Requests,
    build,
    cluster_rate,
    open_loop,
)
from bench.cluster.scale_stacks import (
    PULL_STACKS,
    Devices,
    Side,
    start_push,
    start_router,
    wait_gateway,
    wait_router,
    wait_workers,
)

VIEW = frozenset({"least", "p2c", "least+own"})


def devices_for(workload: str, workers: int, cost: Any) -> Devices:
    slow = slowdowns(workers, SLOW_SHARE.get(workload, 0.0), SLOW_FACTOR)
    per = MODELS_PER_WORKER.get(workload, len(MODELS))
    return Devices(workload, [Device(cost, s) for s in slow], hosting_map(workers, MODELS, per))


def choose_scale(args: argparse.Namespace, n: int) -> float:
    """Every device's cost multiplier: the cluster's capacity on small requests at most
    ``--max-host-rps`` (the host path's budget on this machine), never faster than measured."""
    if args.scale:
        return float(args.scale)
    base = device_cost(args.device)
    probe = build("small", 2000, base, args.seed).workload
    return max(1.0, cluster_rate(probe, base, [1.0] * n) / float(args.max_host_rps))


async def _scrape(session: aiohttp.ClientSession, side: Side) -> list[float]:
    async def one(url: str) -> float:
        async with session.get(url) as response:
            return forward_seconds(await response.text())

    return list(await asyncio.gather(*(one(u) for u in side.metrics_urls)))


def _cpu(roles: dict[str, list[int]]) -> dict[str, float]:
    return {role: sum(report.process_cpu_s(p) for p in pids) for role, pids in roles.items()}


async def run_one(
    session: aiohttp.ClientSession,
    url: str,
    side: Side,
    roles: dict[str, list[int]],
    requests: Requests,
    rate: float,
    args: argparse.Namespace,
    offset: int,
) -> dict[str, Any]:
    before, cpu0, t0 = await _scrape(session, side), _cpu(roles), time.perf_counter()
    meter = report.CpuMeter([p for pids in roles.values() for p in pids])
    result = await open_loop(session, url, requests, rate, args.duration_s, offset)
    wall = time.perf_counter() - t0
    after, cpu1 = await _scrape(session, side), _cpu(roles)
    result["busy"] = busy_fractions(before, after, wall)
    result["cores"] = {r: (cpu1[r] - cpu0[r]) / wall for r in roles}
    result["machine"] = meter.result()
    return result


async def run_side(
    children: Children,
    side: Side,
    devices: Devices,
    requests: Requests,
    modes: list[tuple[str, str | None, float | None]],
    rates: dict[float, float],
    args: argparse.Namespace,
    is_push: bool,
) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s + 10)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        took = await wait_workers(session, children, side, args.ready_timeout_s)
        if not is_push:
            await wait_gateway(session, children, side, devices, args.ready_timeout_s)
        print(f"  {len(side.workers)} workers ready in {took:.1f} s")
        for name, policy, refresh in modes:
            router: Child | None = None
            url, roles = side.url, {"client": [os.getpid()], **side.roles}
            if policy is not None:
                router = start_router(children, side, devices, policy, refresh, args.seed)
                await wait_router(session, children, router)
                url, roles["router"] = router.url, [router.pid]
            for i, (load, rate) in enumerate(rates.items()):
                await open_loop(session, f"{url}/v1/embeddings", requests, rate, 0.5, 50_000)
                run = await run_one(
                    session,
                    f"{url}/v1/embeddings",
                    side,
                    roles,
                    requests,
                    rate,
                    args,
                    offset=i * 1009,
                )
                children.check()
                run.update(
                    workload=requests.name,
                    mode=name,
                    policy=policy,
                    refresh_ms=refresh,
                    load=load,
                    rate=rate,
                )
                runs.append(run)
                print(scale_report.line(run), flush=True)
            if router is not None:
                router.stop()
    return runs


def run(args: argparse.Namespace) -> dict[str, Any]:
    from embedder.tasks.fleet import load_fleet

    started = time.perf_counter()
    spec = load_fleet().get("all-minilm-l6-v2")
    n = args.workers
    scale = choose_scale(args, n)
    cost = device_cost(args.device, scale)
    out_dir = args.out_dir or report.results_dir()
    logs = out_dir / f"{args.out}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in [*logs.glob("*.log"), *logs.glob("*.yaml")]:
        old.unlink()
    push_modes: list[tuple[str, str | None, float | None]] = []
    for policy in args.policies:
        if policy in VIEW:
            push_modes += [(f"push {policy} R={r:g}ms", policy, r) for r in args.refresh_ms]
        else:
            push_modes.append((f"push {policy}", policy, None))
    stack = PULL_STACKS[args.pull]()
    pull_mode: list[tuple[str, str | None, float | None]] = [(f"pull ({stack.name})", None, None)]
    print(f"{n} workers a side, device {cost.label}; pull through {stack.name}")
    runs: list[dict[str, Any]] = []
    workload_info: dict[str, Any] = {}
    env = {"HF_HUB_OFFLINE": "1", "FLOTILLA_AUTO_TRUNCATE": "true"}
    with contextlib.ExitStack() as stack_ctx:
        data_dir = Path(stack_ctx.enter_context(tempfile.TemporaryDirectory(prefix="flotilla-cs-")))
        stack_ctx.callback(stack.stop)
        children = stack_ctx.enter_context(Children(logs, env))
        for name in args.workloads:
            devices = devices_for(name, n, cost)
            requests = build(name, args.n_requests, cost, args.seed)
            full = cluster_rate(requests.workload, cost, [d.slowdown for d in devices.devices])
            rates = {load: load * full for load in args.loads}
            workload_info[name] = {
                "capacity_rps": full,
                "slowdowns": [d.slowdown for d in devices.devices],
                "hosting": devices.hosting,
                "mean_tokens": sum(requests.tokens) / len(requests.tokens),
                # One mean request alone on a full-speed device: the latency unit.
                "single_request_s": cost.fixed_s
                + cost.per_token_s * sum(requests.tokens) / len(requests.tokens),
            }
            print(
                f"\n{name}: cluster capacity {full:,.0f} req/s; loads "
                f"{', '.join(f'{r:,.0f}' for r in rates.values())} req/s"
            )
            sides: list[tuple[bool, list[tuple[str, str | None, float | None]]]] = [
                (True, push_modes)
            ]
            if devices.subsets and not stack.serves_subsets:
                workload_info[name]["pull"] = (
                    f"not run: the {stack.name} queue cannot pull by model (every worker "
                    "of its group must host every model)"
                )
                print(f"  pull skipped: {workload_info[name]['pull']}")
            else:
                sides.append((False, pull_mode))
            for is_push, modes in sides:
                side = (
                    start_push(args, children, spec, devices, data_dir)
                    if is_push
                    else stack.start(args, children, spec, devices)
                )
                runs += asyncio.run(
                    run_side(children, side, devices, requests, modes, rates, args, is_push)
                )
                side.stop()
    return {
        "benchmark": "cluster_scale",
        "machine": report.machine(1),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "device": {
            "label": cost.label,
            "source": cost.source,
            "scale": scale,
            "fixed_ms": 1e3 * cost.fixed_s,
            "us_per_token": 1e6 * cost.per_token_s,
        },
        "pull_stack": stack.name,
        "workloads": workload_info,
        "runs": runs,
        "elapsed_s": time.perf_counter() - started,
    }


def _floats(value: str) -> list[float]:
    values = [float(v) for v in value.split(",") if v.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("give positive numbers, comma-separated")
    return values


def _names(allowed: Sequence[str]) -> Any:
    def parse(value: str) -> list[str]:
        names = [v.strip() for v in value.split(",") if v.strip()]
        if not names or any(n not in allowed for n in names):
            raise argparse.ArgumentTypeError(f"choose among {', '.join(allowed)}")
        return names

    return parse


QUICK = {
    "workers": 16,
    "duration_s": 3.0,
    "loads": [0.8],
    "policies": ["rr", "least+own"],
    "refresh_ms": [50.0],
    "n_requests": 4000,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.cluster.scale",
        description="Push against pull with 16-64 real worker processes on emulated devices.",
    )
    p.add_argument("--quick", action="store_true", help="a smoke run of about 3 minutes")
    p.add_argument("--workers", type=int, default=16, help="worker processes a side (16)")
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="cpu: this machine's measured fit; gpu-like: scaled, HYPOTHETICAL",
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
        default=80.0,
        help="the cluster's capacity in small requests/s that the devices are "
        "slowed to: what this machine's host path carries in under half its cores",
    )
    p.add_argument("--workloads", type=_names(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--policies", type=_names(list(POLICIES)), default=list(POLICIES))
    p.add_argument("--refresh-ms", type=_floats, default=[50.0], help="R of the view (50)")
    p.add_argument(
        "--loads",
        type=_floats,
        default=[0.5, 0.7, 0.9, 1.1],
        help="offered loads, fractions of the cluster's capacity",
    )
    p.add_argument("--duration-s", type=float, default=10.0, help="per run (10)")
    p.add_argument(
        "--p99-ms",
        type=float,
        default=None,
        help=("the p99 target; default 10x one mean request alone on a full-speed device"),
    )
    p.add_argument("--pull", choices=sorted(PULL_STACKS), default="jetstream")
    p.add_argument("--nats", default=None, help="an existing nats-server; else one is started")
    p.add_argument("--n-requests", type=int, default=20000)
    p.add_argument("--seed", type=int, default=20261129)
    p.add_argument("--request-timeout-s", type=float, default=30.0)
    p.add_argument("--ready-timeout-s", type=float, default=240.0)
    p.add_argument("--summarize", type=Path, default=None, metavar="JSON")
    p.add_argument("--out", default="cluster_scale")
    p.add_argument("--out-dir", type=Path, default=None)
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
    if not 1 <= args.workers <= 64:
        p.error("--workers must be in 1..64")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize is not None:
        data = json.loads(args.summarize.read_text(encoding="utf-8"))
    else:
        data = run(args)
    data["summary"] = scale_report.summarize(data, args.p99_ms)
    print()
    print(scale_report.tables(data))
    out_dir = args.out_dir or report.results_dir()
    path = out_dir / f"{args.out}.json"
    path.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    png = out_dir / f"{args.out}.png"
    scale_report.plot(data, png)
    print(f"\nwrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
