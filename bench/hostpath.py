"""Host-path ceiling: what the gateway, queue and worker carry with no model to wait for.

``flotilla serve`` runs in a subprocess with a one-model fleet whose model (the default
fleet's, all-MiniLM-L6-v2) runs on the emulated device: its real tokenizer and
dimension, a forward that costs nothing (or ``--ms-per-1k-tokens`` of sleep per 1,000
padded tokens, emulating a device of that speed). The same closed-loop clients as
``bench.served`` (its planner and load generator, imported) send ``/v1/embeddings``
requests of 1-8 texts. Per concurrency level: requests/s, inputs/s and tokens/s the
server carried, the server process's CPU time (how many cores it kept busy) and so the
tokens per second each core of host work carries, and what that implies for feeding a
GPU at 1M tokens/s. The load generator shares the machine: its CPU is reported too.

    python -m bench.hostpath [--concurrency 16,64] [--duration-s 10] [--encoding float]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import numpy as np
import yaml

from bench import report, served, texts
from embedder.core.fleet import ModelSpec

GPU_TOKENS_PER_S = 1_000_000  # the device the host would have to feed
EMULATED_ENV = "FLOTILLA_EMULATED_MS_PER_1K_TOKENS"


def emulated(spec: ModelSpec) -> ModelSpec:
    """``spec`` with every profile on the emulated device, batch limits unchanged."""
    profiles = {
        kind: profile.model_copy(update={"runtime": "emulated"})
        for kind, profile in (spec.profiles or {"cpu": spec.profile("cpu")}).items()
    }
    return spec.model_copy(update={"profiles": profiles})


# The printed table: a header and how each row's cell is read from a level's summary.
COLUMNS: list[tuple[str, Callable[[dict[str, Any]], object]]] = [
    ("clients", lambda r: r["concurrency"]),
    ("ok", lambda r: r["ok"]),
    ("errors", lambda r: sum(r["errors"].values())),
    ("req/s", lambda r: r["requests_per_s"]),
    ("inputs/s", lambda r: r["inputs_per_s"]),
    ("tokens/s", lambda r: r["tokens_per_s"]),
    ("server cores", lambda r: r["server_cores_busy"]),
    ("tok/s per core", lambda r: r["tokens_per_s_per_server_core"]),
    ("cores for 1M", lambda r: r["server_cores_for_1m_tokens_per_s"] or float("nan")),
    ("p50 ms", lambda r: r["latency_ms"]["p50"]),
    ("p99 ms", lambda r: r["latency_ms"]["p99"]),
    ("req/batch", lambda r: r["mean_requests_per_batch"] or float("nan")),
    ("machine busy", lambda r: f"{100 * r['cpu'].get('machine_busy_share', 0):.0f}%"),
]


def level_row(level: served.Level, inputs_sent: int, server_cpu_s: float) -> dict[str, Any]:
    elapsed = level.elapsed_s or float("nan")
    inputs = inputs_sent * (level.ok / level.sent if level.sent else 0.0)  # errors carry none
    cores = server_cpu_s / elapsed
    tokens_per_s = level.tokens / elapsed
    per_core = tokens_per_s / cores if cores else float("nan")
    ms = [s * 1e3 for s in level.latencies_s]
    return {
        "concurrency": level.concurrency,
        "ok": level.ok,
        "errors": dict(level.errors),
        "token_count_mismatches": level.token_mismatches,
        "requests_per_s": level.ok / elapsed,
        "inputs_per_s": inputs / elapsed,
        "tokens_per_s": tokens_per_s,
        "server_cores_busy": cores,
        "tokens_per_s_per_server_core": per_core,
        "server_cores_for_1m_tokens_per_s": GPU_TOKENS_PER_S / per_core if per_core else None,
        "latency_ms": {"p50": report.percentile(ms, 50), "p99": report.percentile(ms, 99)},
        "mean_requests_per_batch": level.batch_requests / level.batches if level.batches else None,
        "cpu": level.cpu,
    }


async def sweep(
    port: int, pid: int, args: argparse.Namespace, plan: served.Plan
) -> list[dict[str, Any]]:
    url = f"http://{served.HOST}:{port}/v1/embeddings"
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=max(args.concurrency))
    rows: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        warm = served.Level(concurrency=min(4, max(args.concurrency)))
        await served.run_level(session, url, plan, warm, args.warmup_s, args.max_requests, 0)
        offset = warm.sent
        for concurrency in args.concurrency:
            level = served.Level(concurrency=concurrency)
            meter = report.CpuMeter([pid])
            before = await served.batch_counters(session, port)
            cpu_before = report.process_cpu_s(pid)
            await served.run_level(
                session, url, plan, level, args.duration_s, args.max_requests, offset
            )
            server_cpu_s = report.process_cpu_s(pid) - cpu_before
            level.cpu = meter.result()
            after = await served.batch_counters(session, port)
            level.batches, level.batch_requests, level.batch_tokens = (
                a - b for a, b in zip(after, before, strict=True)
            )
            # run_level sends the plan's requests in order from ``offset``.
            inputs_sent = sum(
                len(plan.texts[(offset + n) % len(plan.texts)]) for n in range(level.sent)
            )
            row = level_row(level, inputs_sent, server_cpu_s)
            offset += level.sent
            rows.append(row)
            print(
                f"  c={concurrency:>3}: {row['requests_per_s']:,.0f} req/s, "
                f"{row['tokens_per_s']:,.0f} tokens/s on {row['server_cores_busy']:.2f} server "
                f"cores = {row['tokens_per_s_per_server_core']:,.0f} tokens/s per core; "
                f"errors {dict(level.errors)}"
            )
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hostpath",
        description="The host path's own ceiling: flotilla serve on the emulated device.",
    )
    parser.add_argument("--concurrency", type=served._levels, default=[16, 64])
    parser.add_argument("--duration-s", type=float, default=10.0, help="per concurrency level")
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--n-texts", type=int, default=1000, help="passages in the corpus")
    parser.add_argument(
        "--ms-per-1k-tokens",
        type=float,
        default=0.0,
        help="the emulated forward's sleep per 1,000 padded tokens (1.0 = a 1M tokens/s "
        "device); 0: free",
    )
    parser.add_argument("--encoding", choices=("float", "base64"), default="float")
    parser.add_argument("--request-timeout-s", type=float, default=60.0)
    parser.add_argument("--ready-timeout-s", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=texts.SEED)
    parser.add_argument("--out", default="hostpath", help="results file stem in bench/results/")
    args = parser.parse_args(argv)
    if not 0 < args.duration_s <= 600 or args.ms_per_1k_tokens < 0:
        parser.error("--duration-s must be in (0, 600] and --ms-per-1k-tokens >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embedder.tasks.fleet import load_fleet

    fleet = load_fleet()
    spec = emulated(fleet.get(fleet.default_model))
    corpus = texts.build(args.n_texts, args.seed)
    plan = served.plan_requests(corpus, spec.name, spec.max_tokens, 4096, args.seed, args.encoding)

    port = served.free_port()
    log_path = report.results_dir() / f"{args.out}-server.log"
    fleet_path = log_path.with_name(f"{args.out}-fleet.yaml")
    fleet_path.write_text(yaml.safe_dump(served.one_model_fleet(spec)), encoding="utf-8")
    os.environ[EMULATED_ENV] = str(args.ms_per_1k_tokens)  # the server inherits it
    print(
        f"flotilla serve on the emulated device ({args.ms_per_1k_tokens:g} ms per 1k padded "
        f"tokens), {spec.name}'s tokenizer, on {served.HOST}:{port} (log: {log_path})"
    )
    started = time.perf_counter()
    with served.server(port, 1, log_path, args.ready_timeout_s, fleet_path) as pid:
        print(f"  ready after {time.perf_counter() - started:.1f} s")
        rows = asyncio.run(sweep(port, pid, args, plan))

    best = max(rows, key=lambda r: r["tokens_per_s"])
    result: dict[str, Any] = {
        "benchmark": "hostpath",
        "model": spec.name,
        "machine": report.machine(1),
        "args": dict(vars(args)),
        "requests": {
            "inputs_per_request": f"1-{served.MAX_INPUTS}, uniform",
            "mean_inputs": float(np.mean([len(t) for t in plan.texts])),
            "mean_tokens": float(np.mean(plan.tokens)),
            "encoding_format": args.encoding,
        },
        "levels": rows,
        "gpu": {
            "tokens_per_s": GPU_TOKENS_PER_S,
            "best_tokens_per_s": best["tokens_per_s"],
            "share_of_gpu_one_process": best["tokens_per_s"] / GPU_TOKENS_PER_S,
            "server_cores_needed": best["server_cores_for_1m_tokens_per_s"],
        },
    }
    print()
    print(
        report.table(
            [name for name, _ in COLUMNS], [[cell(r) for _, cell in COLUMNS] for r in rows]
        )
    )
    print(
        f"\nbest: {best['tokens_per_s']:,.0f} tokens/s through one server process = "
        f"{100 * best['tokens_per_s'] / GPU_TOKENS_PER_S:.1f}% of a 1M tokens/s GPU; at "
        f"{best['tokens_per_s_per_server_core']:,.0f} tokens/s per core of host work, "
        f"feeding it takes {best['server_cores_for_1m_tokens_per_s'] or float('nan'):.1f} "
        "cores (so several processes: one process's Python runs on one core at a time)"
    )
    path = report.write_json(f"{args.out}.json", result)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
