"""Push versus pull with real processes on this machine.

The same worker code both ways (``ModelHost`` -> ``Worker``: pull what fits, form a
token-budgeted batch, run it), the same model, profile, threads and requests:

- push: N ``flotilla serve`` processes (each its gateway, in-process queue and worker)
  behind one ``bench.cluster.router`` process that assigns every request to a worker by a
  policy on a view of their load refreshed every R ms (round-robin needs no view);
- pull: ``flotilla gateway --kafka`` and N ``flotilla worker --kafka`` processes over a
  real Kafka broker: the gateway annotates and produces, the workers pull.

Both stacks start once and stay up; for each number of closed-loop clients (the
matched load) every mode runs for the same time on the same request sequence
(bench.served's client: ``/v1/embeddings`` with 1-8 mixed-length corpus texts), the
order of the modes rotating from level to level so that drift on a shared machine
does not favour one. A new router process starts for each push run. Reported: tokens/s,
requests/s, p50/p99 latency, errors, the CPU each role used, and pull/push tokens/s
at each level and at a p99 target.

Everything shares this machine's cores: the clients, the router, the gateway, the
broker and the workers. On a small machine the overhead processes take CPU the
workers would otherwise get, and that is part of what is measured.

    python -m bench.cluster.real [--workers 2] [--threads 1] [--concurrency 4,16,48]
        [--duration-s 15] [--policies rr,least,least+own] [--refresh-ms 50]
        [--p99-ms MS] [--kafka BOOTSTRAP] [--fleet FILE] [--summarize JSON]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

from bench import report, served, texts
from bench.cluster.policies import VIEW_POLICIES
from bench.cluster.processes import HOST, Child, Children, free_port, wait_until
from bench.cluster.router import POLICIES

UNLIMITED_TOKENS = 10_000_000  # admission control stays out of the comparison


@dataclass(frozen=True)
class Mode:
    name: str
    policy: str | None = None  # None: pull
    refresh_ms: float | None = None

    @property
    def side(self) -> str:
        return "pull" if self.policy is None else "push"


def modes(policies: Sequence[str], refresh_ms: Sequence[float]) -> list[Mode]:
    out = [Mode("pull (Kafka)")]
    for policy in policies:
        if policy in VIEW_POLICIES:
            out += [Mode(f"push {policy} R={r:g}ms", policy, r) for r in refresh_ms]
        else:
            out.append(Mode(f"push {policy}", policy))
    return out


@dataclass
class Cluster:
    children: Children
    push: list[Child]
    gateway: Child
    pull: list[Child]
    roles: dict[str, list[int]]  # pids of each role, for CPU accounting

    @property
    def push_urls(self) -> list[str]:
        return [child.url for child in self.push]

    @property
    def gateway_url(self) -> str:
        return self.gateway.url


def start_push(args: argparse.Namespace, children: Children, data_dir: Path) -> list[Child]:
    """N ``flotilla serve`` processes: gateway, in-process queue and worker in each."""
    workers = []
    for i in range(args.workers):
        port = free_port()
        flags = [
            "serve", "--host", HOST, "--port", str(port), "--threads", str(args.threads),
            "--data-dir", str(data_dir / f"push-{i}"), *_common(args),
        ]  # fmt: skip
        workers.append(children.start(f"push-worker-{i}", "flotilla", flags, port=port))
    return workers


def start_pull(
    args: argparse.Namespace, children: Children, bootstrap: str
) -> tuple[Child, list[Child]]:
    """``flotilla gateway --kafka`` and N ``flotilla worker --kafka`` on fresh topics."""
    tag = uuid.uuid4().hex[:8]
    kafka = [
        "--kafka", bootstrap, "--request-topic", f"bench-requests-{tag}",
        "--request-partitions", str(args.partitions), "--worker-group", f"bench-workers-{tag}",
        "--status-topic", f"bench-status-{tag}",
    ]  # fmt: skip
    port = free_port()
    flags = [
        "gateway", *kafka, "--host", HOST, "--port", str(port),
        "--reply-topic-prefix", f"bench-replies-{tag}", "--gateway-id", "bench", *_common(args),
    ]  # fmt: skip
    gateway = children.start("pull-gateway", "flotilla", flags, port=port)
    flags = ["worker", *kafka, "--threads", str(args.threads), *_common(args)]
    workers = []
    for i in range(args.workers):
        port = free_port()  # the worker's own /metrics: its batch sizes
        workers.append(
            children.start(f"pull-worker-{i}", "flotilla", [*flags, "--worker-port", str(port)],
                           port=port)
        )  # fmt: skip
    return gateway, workers


def _common(args: argparse.Namespace) -> list[str]:
    return [
        "--device", "cpu", "--log-level", "warning",
        "--max-inflight-tokens", str(UNLIMITED_TOKENS),
        "--request-timeout-s", str(args.request_timeout_s),
        *(["--fleet", str(args.fleet)] if args.fleet else []),
    ]  # fmt: skip


async def _json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        response.raise_for_status()
        return await response.json()


async def wait_ready(session: aiohttp.ClientSession, cluster: Cluster, timeout_s: float) -> None:
    async def push_ready() -> bool:
        for url in cluster.push_urls:
            async with session.get(f"{url}/ready") as response:
                if response.status != 200:
                    return False
        return True

    async def pull_ready() -> bool:
        model = (await _json(session, f"{cluster.gateway_url}/v1/models"))["data"][0]
        return bool(model["state"] == "ready" and model["workers"] == len(cluster.pull))

    took = await wait_until(push_ready, cluster.children, "the push workers", timeout_s)
    print(f"  push workers ready after {took:.1f} s")
    took = await wait_until(pull_ready, cluster.children, "the pull gateway and workers", timeout_s)
    print(f"  pull gateway and workers ready {took:.1f} s later")


async def embed(session: aiohttp.ClientSession, url: str, body: bytes) -> Any:
    async with session.post(
        f"{url}/v1/embeddings", data=body, headers={"content-type": "application/json"}
    ) as response:
        response.raise_for_status()
        data = await response.json()
    vectors = np.asarray([item["embedding"] for item in data["data"]], dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def cpu_seconds(roles: dict[str, list[int]]) -> dict[str, float]:
    return {role: sum(report.process_cpu_s(pid) for pid in pids) for role, pids in roles.items()}


async def start_router(
    session: aiohttp.ClientSession, cluster: Cluster, mode: Mode, label: str, seed: int
) -> Child:
    assert mode.policy is not None
    port = free_port()
    flags = [
        "--port", str(port), "--policy", mode.policy, "--seed", str(seed),
        *(["--refresh-ms", str(mode.refresh_ms)] if mode.refresh_ms else []),
        *(f"--worker={url}" for url in cluster.push_urls),
    ]  # fmt: skip
    router = cluster.children.start(f"router-{label}", "bench.cluster.router", flags, port=port)
    await wait_until(
        lambda: _ok(session, f"{router.url}/router/ready"), cluster.children, "the router", 30
    )
    return router


async def run_mode(
    session: aiohttp.ClientSession,
    cluster: Cluster,
    mode: Mode,
    concurrency: int,
    plan: served.Plan,
    args: argparse.Namespace,
    offset: int,
) -> dict[str, Any]:
    """One mode at one level: start its router (push), run the clients, account."""
    roles = dict(cluster.roles)
    router: Child | None = None
    url = cluster.gateway_url
    if mode.policy is not None:
        label = f"{mode.policy}-{mode.refresh_ms or 0:g}ms-c{concurrency}"
        router = await start_router(session, cluster, mode, label, args.seed)
        url = router.url
        roles["router"] = [router.pid]
    if args.wait_quiet_s > 0:
        await asyncio.to_thread(report.wait_for_quiet, args.wait_quiet_s)
    level = served.Level(concurrency=concurrency)
    before_cpu = cpu_seconds(roles)
    meter = report.CpuMeter(
        [pid for role, pids in roles.items() if role != "client" for pid in pids]
    )
    counted = cluster.push if router else cluster.pull
    before = await _batches(session, counted)
    await served.run_level(
        session, f"{url}/v1/embeddings", plan, level, args.duration_s, args.max_requests, offset
    )
    level.cpu = meter.result()
    after_cpu = cpu_seconds(roles)
    cluster.children.check()
    after = await _batches(session, counted)
    level.batches, level.batch_requests, level.batch_tokens = (
        a - b for a, b in zip(after, before, strict=True)
    )
    result = level.summary(0.0)
    del result["share_of_engine_ceiling"]
    result["cores"] = {
        role: (after_cpu[role] - before_cpu[role]) / level.elapsed_s for role in roles
    }
    result["router"] = None
    if router is not None:
        result["router"] = await _json(session, f"{url}/router/stats")
        router.stop()
    return {"mode": mode.name, "side": mode.side, "policy": mode.policy,
            "refresh_ms": mode.refresh_ms, **result}  # fmt: skip


async def _ok(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(url) as response:
        return response.status == 200


async def _batches(
    session: aiohttp.ClientSession, workers: Sequence[Child]
) -> tuple[float, float, float]:
    """Batches, requests and tokens the workers ran so far, from their /metrics."""
    totals = [await served.batch_counters(session, child.port or 0) for child in workers]
    return (
        sum(t[0] for t in totals),
        sum(t[1] for t in totals),
        sum(t[2] for t in totals),
    )


def _line(run: dict[str, Any]) -> str:
    lat = run["latency_ms"]
    return (
        f"  c={run['concurrency']:>3} {run['mode']:<26} {run['ok']:>5} ok "
        f"{run['tokens_per_s']:>8,.0f} tok/s  p50 {lat['p50']:>6,.0f} ms  "
        f"p99 {lat['p99']:>6,.0f} ms  errors {sum(run['errors'].values())}"
    )


async def check_and_warm(
    session: aiohttp.ClientSession, cluster: Cluster, plan: served.Plan, args: argparse.Namespace
) -> float:
    """The same request both ways (the worst cosine of its vectors), then a short load
    on each side so no measured run pays for first batches or Kafka metadata."""
    body = plan.bodies[0]
    push_vectors = await embed(session, cluster.push_urls[0], body)
    pull_vectors = await embed(session, cluster.gateway_url, body)
    cosine = float((push_vectors * pull_vectors).sum(axis=1).min())
    print(f"  the same request both ways: worst cosine {cosine:.6f}")
    warm_ups = [(url, 2) for url in cluster.push_urls] + [(cluster.gateway_url, 2 * args.workers)]
    for url, clients in warm_ups:
        level = served.Level(clients)
        await served.run_level(
            session, f"{url}/v1/embeddings", plan, level, args.warmup_s, args.max_requests, 0
        )
    return cosine


async def measure(
    cluster: Cluster, plan: served.Plan, model: str, args: argparse.Namespace
) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s + 10)
    connector = aiohttp.TCPConnector(limit=0)
    all_modes = modes(args.policies, args.refresh_ms)
    runs: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await wait_ready(session, cluster, args.ready_timeout_s)
        # Both paths must give the same answer before their speed means anything.
        cosine = await check_and_warm(session, cluster, plan, args)
        for i, concurrency in enumerate(args.concurrency):
            # Each level its own stretch of the requests; every mode at a level the same.
            offset = (i * 1009) % len(plan.bodies)
            for j in range(len(all_modes)):
                mode = all_modes[(i + j) % len(all_modes)]
                run = await run_mode(session, cluster, mode, concurrency, plan, args, offset)
                runs.append(run)
                print(_line(run), flush=True)
    return {
        "model": model,
        "cosine_push_vs_pull": cosine,
        "modes": [m.name for m in all_modes],
        "runs": runs,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from embedder.fleet import load_fleet

    started = time.perf_counter()
    fleet = load_fleet(args.fleet)
    spec = fleet.get(fleet.default_model)
    corpus = texts.build(args.n_texts, args.seed)
    plan = served.plan_requests(corpus, spec.name, spec.max_tokens, 4096, args.seed, "float")
    out_dir = args.out_dir or report.results_dir()
    logs = out_dir / f"{args.out}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in logs.glob("*.log"):  # the last run's
        old.unlink()
    if args.fleet is None:  # every process loads the measured model only, not the whole fleet
        args.fleet = logs / "fleet.yaml"
        args.fleet.write_text(yaml.safe_dump(served.one_model_fleet(spec)), encoding="utf-8")
    env = {"HF_HUB_OFFLINE": "1", "FLOTILLA_AUTO_TRUNCATE": "true"}
    with contextlib.ExitStack() as stack:
        data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flotilla-cr-")))
        broker = None
        if args.kafka is None:
            from tests.kafka.broker import KafkaBroker

            broker = KafkaBroker()
            stack.callback(broker.stop)  # after the processes using it have stopped
        children = stack.enter_context(Children(logs, env))
        print(f"starting {args.workers} push workers, a router per push run, a Kafka gateway "
              f"and {args.workers} pull workers (logs: {logs})")  # fmt: skip
        push = start_push(args, children, data_dir)  # they load their models meanwhile
        bootstrap, broker_pid = args.kafka, None
        if broker is not None:
            broker.start()
            bootstrap, broker_pid = broker.bootstrap, broker.pid
            print(f"  Kafka broker up in {broker.start_s:.1f} s at {bootstrap}")
        gateway, pull = start_pull(args, children, bootstrap)
        roles = {
            "client": [os.getpid()],
            "push workers": [c.pid for c in push],
            "gateway": [gateway.pid],
            "pull workers": [c.pid for c in pull],
        }
        if broker_pid is not None:
            roles["broker"] = [broker_pid]
        cluster = Cluster(children, push, gateway, pull, roles)
        measured = asyncio.run(measure(cluster, plan, spec.name, args))
    return {
        "benchmark": "cluster_real",
        "machine": report.machine(args.threads),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "workload": {
            "route": "/v1/embeddings",
            "inputs_per_request": f"1-{served.MAX_INPUTS}, uniform",
            "mean_inputs": float(np.mean([len(t) for t in plan.texts])),
            "mean_tokens": float(np.mean(plan.tokens)),
            "clients": "closed loop",
        },
        "broker": "started by the benchmark" if broker_pid else f"given: {args.kafka}",
        **measured,
        "elapsed_s": time.perf_counter() - started,
    }


def _ints(value: str) -> list[int]:
    levels = [int(v) for v in value.split(",") if v.strip()]
    if not levels or any(n <= 0 or n > 1024 for n in levels):
        raise argparse.ArgumentTypeError("give integers in 1..1024, comma-separated")
    return levels


def _floats(value: str) -> list[float]:
    values = [float(v) for v in value.split(",") if v.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("give positive numbers, comma-separated")
    return values


def _policies(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"policies are among {', '.join(POLICIES)}")
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster.real",
        description="Push (a router over worker processes) versus pull (Kafka), for real.",
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes per side (2)")
    parser.add_argument("--threads", type=int, default=1, help="inference threads per worker (1)")
    parser.add_argument(
        "--concurrency",
        type=_ints,
        default=[4, 16, 48],
        help="closed-loop clients per level, comma-separated (4,16,48)",
    )
    parser.add_argument("--duration-s", type=float, default=15.0, help="per mode and level (15)")
    parser.add_argument("--max-requests", type=int, default=5000, help="per mode and level")
    parser.add_argument("--warmup-s", type=float, default=4.0)
    parser.add_argument(
        "--policies", type=_policies, default=["rr", "least", "least+own"],
        help=f"push policies among {', '.join(POLICIES)} (rr,least,least+own; p2c is least "
        "with 2 workers)",
    )  # fmt: skip
    parser.add_argument(
        "--refresh-ms", type=_floats, default=[50.0],
        help="R, the router's view refresh period(s) for the policies that read it (50)",
    )  # fmt: skip
    parser.add_argument(
        "--p99-ms", type=float, default=None,
        help="the p99 latency target; default: twice the best p99 at the lightest level",
    )  # fmt: skip
    parser.add_argument("--kafka", default=None, help="an existing broker; else one is started")
    parser.add_argument("--partitions", type=int, default=12, help="of the request topic")
    parser.add_argument("--fleet", type=Path, default=None, help="default: the bundled fleet")
    parser.add_argument("--n-texts", type=int, default=1000, help="passages in the corpus")
    parser.add_argument("--seed", type=int, default=texts.SEED)
    parser.add_argument("--request-timeout-s", type=float, default=60.0)
    parser.add_argument("--ready-timeout-s", type=float, default=180.0)
    parser.add_argument(
        "--wait-quiet-s", type=float, default=0.0,
        help="on a shared machine, wait up to this long before each run for quiet",
    )  # fmt: skip
    parser.add_argument(
        "--summarize", type=Path, default=None, metavar="JSON",
        help="run nothing: summarize a saved run again (say, with another --p99-ms)",
    )  # fmt: skip
    parser.add_argument("--out", default="cluster_real", help="name of the JSON and PNG files")
    parser.add_argument("--out-dir", type=Path, default=None, help="default bench/results")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.threads < 1 or args.duration_s <= 0:
        parser.error("--workers, --threads and --duration-s must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from bench.cluster import real_report

    args = parse_args(argv)
    if args.summarize is not None:
        data = json.loads(args.summarize.read_text(encoding="utf-8"))
    else:
        data = run(args)
    data["summary"] = real_report.summarize(data, args.p99_ms)
    print()
    print(real_report.tables(data))
    out_dir = args.out_dir or report.results_dir()
    path = out_dir / f"{args.out}.json"
    path.write_text(real_report.json_text(data), encoding="utf-8")
    png = out_dir / f"{args.out}.png"
    real_report.plot(data, png)
    took = "" if args.summarize else f"{data['elapsed_s']:.0f} s; "
    print(f"\n{took}wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
