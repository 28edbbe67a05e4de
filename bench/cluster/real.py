"""Push versus pull with real processes on this machine.

The same worker code both ways (``ModelHost`` -> ``Worker``: pull what fits, form a
token-budgeted batch, run it), the same model, profile, threads and requests:

- push: N ``flotilla serve`` processes (each its gateway, in-process queue and worker)
  behind one ``bench.cluster.router`` process that assigns every request to a worker by a
  policy on a view of their load refreshed every R ms (round-robin needs no view);
- pull: ``flotilla gateway --nats`` and N ``flotilla worker --nats`` processes over a
  real nats-server with JetStream: the gateway annotates and publishes to the shared
  work queue, the workers pull from it, any worker any request.

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

This module is the run and its command line: the stacks are ``real_stacks``'s, the
measuring ``real_runs``'s, the ratios, tables and chart ``real_report``'s.

    python -m bench.cluster.real [--workers 2] [--threads 1] [--concurrency 4,16,48]
        [--duration-s 15] [--policies rr,least,least+own] [--refresh-ms 50]
        [--p99-ms MS] [--nats URL] [--fleet FILE] [--summarize JSON]
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

import numpy as np
import yaml

from bench import report, served, texts
from bench.cluster import real_report
from bench.cluster.processes import Children
from bench.cluster.real_runs import measure
from bench.cluster.real_stacks import Cluster, start_pull, start_push
from bench.cluster.router import POLICIES


def run(args: argparse.Namespace) -> dict[str, Any]:
    from embedder.tasks.fleet import load_fleet

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
        if args.nats is None:
            from tests.nats.server import NatsServer

            broker = NatsServer()
            stack.callback(broker.stop)  # after the processes using it have stopped
        children = stack.enter_context(Children(logs, env))
        print(f"starting {args.workers} push workers, a router per push run, a JetStream "
              f"gateway and {args.workers} pull workers (logs: {logs})")  # fmt: skip
        push = start_push(args, children, data_dir)  # they load their models meanwhile
        url, broker_pid = args.nats, None
        if broker is not None:
            broker.start()
            url, broker_pid = broker.url, broker.pid
            print(f"  nats-server up in {broker.start_s:.1f} s at {url}")
        gateway, pull = start_pull(args, children, url)
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
        "broker": "started by the benchmark" if broker_pid else f"given: {args.nats}",
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
        description="Push (a router over worker processes) versus pull (JetStream), for real.",
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
    parser.add_argument(
        "--nats", default=None, help="an existing nats-server with JetStream; else one is started"
    )
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
