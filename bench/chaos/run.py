"""``flotilla bench chaos``: broker faults under a steady load, every answer checked.

It starts a broker (``--broker cluster``: three clustered nats-servers with every
stream on each; ``server``: one file-store nats-server), one ``flotilla gateway`` and two
``flotilla worker`` processes on the fleet's default model, and runs closed-loop clients
for the whole run while it injects faults in phases (``bench.chaos.faults``): steady,
then a broker kill and restart (on a cluster: the node every process is connected to,
leading the work stream), a rolling restart (cluster), and a worker SIGKILLed during a
whole-broker outage. Every 200 is checked against the model's own vectors.

Reported per phase: answers by status (with what the error answers said), correct
answers per second, p50/p99 of the correct answers, and the recovery time: from the
broker's return to the first window of ``--window-s`` in which correct answers arrive
at 90% of the steady rate (``bench.chaos.accounting``). JSON to ``--out-dir``, a table
to the terminal.

    flotilla bench chaos [--quick] [--broker cluster|server] [--clients 16] [--fleet FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from numpy.typing import NDArray

from bench import report, served, texts
from bench.chaos.accounting import WINDOW_S, Answer, Phase, messages_text, phase_table, summarize
from bench.chaos.faults import Faults, faults_for, run_phases
from bench.chaos.load import Check, Load, Request
from bench.chaos.stack import Stack, new_broker, reference_vectors, start_processes, wait_serving
from bench.cluster.processes import Children
from bench.cluster.sim_report import json_text
from bench.load import Plan, plan_requests
from embedder.core.fleet import entry_as
from embedder.tasks.embed.spec import EncoderSpec

MIN_COSINE = 0.999  # a correct answer's worst cosine to the model's own vector
QUICK = {"steady_s": 12.0, "outage_s": 4.0, "recover_s": 12.0, "window_s": 3.0}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="flotilla bench chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--broker",
        choices=("cluster", "server"),
        default="cluster",
        help="three clustered nats-servers (replicas 3), or one file-store server",
    )
    add("--quick", action="store_true", help="about a minute: " + json.dumps(QUICK))
    add("--steady-s", type=float, default=60.0, help="the steady phase (60)")
    add("--outage-s", type=float, default=10.0, help="how long a killed broker stays down (10)")
    add("--recover-s", type=float, default=40.0, help="load after each fault (40)")
    add(
        "--window-s",
        type=float,
        default=WINDOW_S,
        help="recovered: a window this long at 90%% of the steady rate (5)",
    )
    add("--clients", type=int, default=16, help="closed-loop clients (16)")
    add("--workers", type=int, default=2, help="worker processes (2)")
    add("--threads", type=int, default=1, help="inference threads per worker (1)")
    add(
        "--ack-wait-s",
        type=float,
        default=5.0,
        help="--nats-ack-wait-s: a dead worker's requests go to another after it (5)",
    )
    add("--request-timeout-s", type=float, default=15.0)
    add("--fleet", type=Path, default=None, help="default: the bundled fleet's default model")
    add("--n-texts", type=int, default=500, help="passages in the corpus")
    add("--requests", type=int, default=400, help="planned requests, sent in turn")
    add("--seed", type=int, default=texts.SEED)
    add("--ready-timeout-s", type=float, default=180.0)
    add("--out", default="chaos", help="name of the JSON file and the logs folder")
    add("--out-dir", type=Path, default=None, help="default bench/results")
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    if args.recover_s <= args.window_s:
        parser.error("--recover-s must exceed --window-s: recovery is measured within it")
    return args


def checker(plan: Plan, want: dict[str, NDArray[np.float32]]) -> Check:
    """The check of a 200 to request ``i``: its base64 vectors are the model's own."""

    def check(i: int, payload: bytes) -> bool:
        data = sorted(json.loads(payload)["data"], key=lambda item: item["index"])
        got = np.stack(
            [np.frombuffer(base64.b64decode(item["embedding"]), np.float32) for item in data]
        )
        if got.shape[0] != len(plan.texts[i]):
            return False
        got = got / np.linalg.norm(got, axis=1, keepdims=True)
        expected = np.stack([want[text] for text in plan.texts[i]])
        return bool((got * expected).sum(axis=1).min() >= MIN_COSINE)

    return check


async def measure(
    args: argparse.Namespace, chaos: Stack, requests: list[Request], check: Check
) -> tuple[list[Answer], list[Phase]]:
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s + 15)
    connector = aiohttp.TCPConnector(limit=args.clients + 4)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        took = await wait_serving(session, chaos, args.ready_timeout_s)
        print(f"  serving after {took:.1f} s", flush=True)
        await Faults(chaos.broker, chaos.stream, chaos.replace_worker, time.monotonic,
                            args.outage_s).aim()  # fmt: skip
        warmup = Load(session, chaos.url, requests, check)
        asyncio.get_running_loop().call_later(min(5.0, args.steady_s / 2), warmup.stop)
        await warmup.run(args.clients)
        load = Load(session, chaos.url, requests, check)
        injected = Faults(chaos.broker, chaos.stream, chaos.replace_worker, load.now, args.outage_s)
        running = asyncio.create_task(load.run(args.clients))
        try:
            names = faults_for(args.broker == "cluster")
            phases = await run_phases(injected, names, args.steady_s, args.recover_s)
        finally:
            load.stop()
            answers = await running
    return answers, phases


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    from embedder.tasks.fleet import load_fleet

    started = time.perf_counter()
    fleet = load_fleet(args.fleet)
    spec = entry_as(fleet.get(fleet.default_model), EncoderSpec)
    logs = out_dir / f"{args.out}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in logs.glob("*.log"):  # the last run's
        old.unlink()
    if args.fleet is None:  # every process loads the measured model only
        args.fleet = logs / "fleet.yaml"
        args.fleet.write_text(yaml.safe_dump(served.one_model_fleet(spec)), encoding="utf-8")
    plan = plan_requests(texts.build(args.n_texts, args.seed), spec.name, spec.max_tokens,
                         args.requests, args.seed, "base64")  # fmt: skip
    want = reference_vectors(spec, plan, args.threads)
    requests = [Request("/v1/embeddings", body) for body in plan.bodies]
    env = {"HF_HUB_OFFLINE": "1", "FLOTILLA_AUTO_TRUNCATE": "true"}
    with new_broker(args) as nats, Children(logs, env) as children:
        print(f"{args.broker}: {nats.urls} up in {nats.start_s:.1f} s; gateway and "
              f"{args.workers} workers on {spec.name} (logs: {logs})", flush=True)  # fmt: skip
        chaos = start_processes(args, nats, children)
        answers, phases = asyncio.run(measure(args, chaos, requests, checker(plan, want)))
        # A process that died on its own (not killed by a fault) is a finding too.
        exited = {c.name: c.proc.returncode for c in children.started
                  if not c.alive and not c.stopped}  # fmt: skip
    return {
        "benchmark": "chaos",
        "machine": report.machine(args.threads),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model": spec.name,
        "broker": {"kind": args.broker, "nodes": nats.size, "replicas": nats.size},
        "workers_killed": chaos.replaced,
        "exited_on_their_own": exited,
        "phases": summarize(answers, phases, args.window_s),
        "answers": len(answers),
        "elapsed_s": time.perf_counter() - started,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = args.out_dir or report.results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    data = run(args, out_dir)
    print()
    print(phase_table(data["phases"]))
    print(messages_text(data["phases"]))
    for name, code in data["exited_on_their_own"].items():
        print(f"{name} exited on its own with {code}: see its log")
    path = out_dir / f"{args.out}.json"
    path.write_text(json_text(data), encoding="utf-8")
    print(f"\n{data['elapsed_s']:.0f} s; wrote {path}")
    return 0
