"""Generation benchmark: streamed chat completions at 1, 8 and 32 clients.

Every side answers the same fixed prompts (``bench.generation.prompts``: mixed
short prompts, ``max_tokens`` 16-128, greedy) over an OpenAI-compatible
``/v1/chat/completions`` with ``stream: true`` and
``stream_options.include_usage``, measured by one client
(``bench.generation.client``). Sides, in one run:

- ``one-at-a-time``: transformers ``model.generate`` on each request alone
  (the GGUF dequantized to fp32), in its own process;
- ``static``: the same model, static batches of as many requests as there are
  clients (padded left, one ``model.generate`` per batch);
- ``llama-cpp``: llama.cpp's server through ``llama-cpp-python`` on the GGUF,
  when its venv is installed (``python -m bench.peers.llamacpp install``);
- ``flotilla``: ``flotilla serve`` with the fleet entry ``--flotilla-model``
  (default: the ``--model`` name; task ``generate``); skipped with the reason
  when the fleet has no such generation entry.

Per side and level: output tokens/s (completion tokens from ``usage`` over the
level's wall time), time to first token p50/p99, inter-token latency p50/p99,
mean output tokens, errors, the share of the CPU other processes used, and
how many answers equal one-at-a-time's text. JSON and a table to
``bench/results/``.

    python -m bench.generate [--clients 1,8,32] [--sides one-at-a-time,static,llama-cpp]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench import report
from bench.generation import flotilla_side, local
from bench.generation.client import Stream
from bench.generation.load import Target, run_level, summarize
from bench.generation.model_files import GGUF_FILES, gguf_path
from bench.generation.prompts import PROMPTS
from bench.load import HOST, free_port
from bench.peers import llamacpp, server

SIDES = ("one-at-a-time", "static", "llama-cpp", "flotilla")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="flotilla bench generate",
        description="Streamed chat completions: flotilla against model.generate one at a "
        "time, static batches and llama.cpp, on the same prompts.",
    )
    parser.add_argument("--clients", type=report.levels, default=[1, 8, 32], help="levels")
    parser.add_argument(
        "--requests", type=int, default=None, help="requests per level (overrides the next two)"
    )
    parser.add_argument("--min-requests", type=int, default=16, help="requests per level, least")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="requests per level: at least this many per client (max with --min-requests)",
    )
    parser.add_argument(
        "--sides", type=report.sides_of(SIDES), default=list(SIDES), help=", ".join(SIDES)
    )
    parser.add_argument("--model", choices=tuple(GGUF_FILES), default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=50.0,
        help="static batches: how long the first request waits for the batch to fill",
    )
    parser.add_argument("--n-ctx", type=int, default=2048, help="llama.cpp's context tokens")
    parser.add_argument("--warmup", type=int, default=2, help="requests before each side")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--flotilla-model",
        default=None,
        help="the fleet entry (task: generate) flotilla serves; default: --model's name",
    )
    parser.add_argument("--flotilla-fleet", type=Path, default=None, help="its fleet file")
    parser.add_argument(
        "--wait-quiet-s",
        type=float,
        default=0.0,
        help="on a shared machine, wait up to this long before each side for others to go quiet",
    )
    parser.add_argument("--out", default="generate", help="results file stem in bench/results/")
    args = parser.parse_args(argv)
    if (args.requests is not None and args.requests <= 0) or min(
        args.min_requests, args.rounds
    ) <= 0:
        parser.error("--requests, --min-requests and --rounds must be positive")
    if args.threads <= 0 or args.batch_wait_ms < 0:
        parser.error("--threads must be positive and --batch-wait-ms not negative")
    return args


def requests_for(args: argparse.Namespace, clients: int) -> int:
    if args.requests is not None:
        return int(args.requests)
    return max(int(args.min_requests), int(args.rounds) * clients)


# -- the sides -----------------------------------------------------------------
# Each yields a function from the number of clients to the target that level
# sends to (static batches change the batch size with the level).

SideTargets = Callable[[int], Target]


@contextlib.contextmanager
def transformers_server(args: argparse.Namespace, gguf: Path) -> Iterator[tuple[str, int]]:
    """``bench.generation.local`` in its own process; yields its chat route and pid."""
    port = free_port()
    log_path = report.results_dir() / f"{args.out}-transformers.log"
    command = [
        sys.executable,
        "-m",
        "bench.generation.local",
        "--gguf",
        str(gguf),
        "--port",
        str(port),
        "--threads",
        str(args.threads),
        "--batch-wait-ms",
        str(args.batch_wait_ms),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    url = f"http://{HOST}:{port}"
    with server.running(
        command, env, log_path, f"{url}/health", args.ready_timeout_s, "the baselines' server"
    ) as process:
        yield f"{url}/v1/chat/completions", process.pid


def measure(
    side: str,
    targets: SideTargets,
    args: argparse.Namespace,
    pids: Sequence[int],
) -> tuple[list[dict[str, Any]], dict[int, list[Stream]]]:
    """Warm up, then every level; the rows and the streams by level."""
    if args.wait_quiet_s > 0:
        report.wait_for_quiet(args.wait_quiet_s)
    warm = asyncio.run(run_level(targets(1), 1, args.warmup, args.timeout_s))
    failed = [s.error for s in warm if not s.ok]
    if failed:
        raise RuntimeError(f"{side}: the warm-up failed: {failed[0]}")
    rows: list[dict[str, Any]] = []
    streams: dict[int, list[Stream]] = {}
    for clients in args.clients:
        target = targets(clients)
        meter = report.CpuMeter(pids)
        started = time.perf_counter()
        level = asyncio.run(run_level(target, clients, requests_for(args, clients), args.timeout_s))
        row = {"side": side, "model": target.model, **summarize(level, clients)}
        row["cpu"] = meter.result()
        rows.append(row)
        streams[clients] = level
        print(
            f"  {side} x{clients}: {row['output_tokens_per_s']:.1f} output tokens/s, TTFT p50 "
            f"{row['ttft_ms']['p50']:.0f} ms p99 {row['ttft_ms']['p99']:.0f} ms (after the first "
            f"wave p99 {row['ttft_after_first_wave_ms']['p99']:.0f} ms), ITL p50 "
            f"{row['itl_ms']['p50']:.1f} ms p99 {row['itl_ms']['p99']:.1f} ms, "
            f"{row['ok']}/{row['requests']} ok in {time.perf_counter() - started:.0f} s"
        )
    return rows, streams


def same_text_share(streams: Sequence[Stream], reference: Sequence[Stream]) -> float | None:
    """Share of requests whose text equals the reference's for the same request index
    (both lists are in request order, so index k is PROMPTS[k % len])."""
    pairs = [(a, b) for a, b in zip(streams, reference, strict=False) if a.ok and b.ok]
    if not pairs:
        return None
    return sum(1 for a, b in pairs if a.text == b.text) / len(pairs)


def flotilla_config(args: argparse.Namespace) -> flotilla_side.FlotillaSide:
    model = args.flotilla_model or args.model
    return flotilla_side.FlotillaSide(
        model, args.flotilla_fleet, args.threads, args.ready_timeout_s, args.timeout_s
    )


def run_sides(args: argparse.Namespace, gguf: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    streams: dict[str, dict[int, list[Stream]]] = {}

    def record(side: str, targets: SideTargets, pids: Sequence[int]) -> None:
        print(f"{side}: {len(args.clients)} levels of {list(args.clients)} clients")
        side_rows, side_streams = measure(side, targets, args, pids)
        rows.extend(side_rows)
        streams[side] = side_streams

    local_sides = [s for s in ("one-at-a-time", "static") if s in args.sides]
    if local_sides:
        with transformers_server(args, gguf) as (url, pid):
            if "one-at-a-time" in local_sides:
                one = Target("one-at-a-time", url, local.ONE_AT_A_TIME)
                record("one-at-a-time", lambda n: one, [pid])
            if "static" in local_sides:
                record("static", lambda n: Target("static", url, f"static-{n}"), [pid])
    if "llama-cpp" in args.sides:
        missing = llamacpp.PEER.missing()
        if missing is not None:
            skipped["llama-cpp"] = missing
        else:
            start = llamacpp.GenerationStart(
                gguf=gguf,
                model_name=args.model,
                port=free_port(),
                threads=args.threads,
                n_ctx=args.n_ctx,
                log_path=report.results_dir() / f"{args.out}-llama-cpp.log",
                ready_timeout_s=args.ready_timeout_s,
            )
            with llamacpp.PEER.serve(start) as launch:
                target = Target("llama-cpp", launch.url, launch.model)
                record("llama-cpp", lambda n: target, [launch.pid])
    if "flotilla" in args.sides:
        ours = flotilla_config(args)
        try:
            log_path = report.results_dir() / f"{args.out}-flotilla.log"
            with flotilla_side.serve(ours, log_path) as (target, pid):
                record("flotilla", lambda n: target, [pid])
        except flotilla_side.SkipSide as exc:
            skipped["flotilla"] = str(exc)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")

    reference = streams.get("one-at-a-time", {})
    for row in rows:
        ref = reference.get(row["clients"])
        mine = streams[row["side"]][row["clients"]]
        row["same_text_as_one_at_a_time"] = same_text_share(mine, ref) if ref else None
        base = next(
            (r for r in rows if r["side"] == "one-at-a-time" and r["clients"] == row["clients"]),
            None,
        )
        rate = base["output_tokens_per_s"] if base else 0.0
        row["x_one_at_a_time"] = row["output_tokens_per_s"] / rate if rate else None
    return rows, skipped


def table(rows: Sequence[dict[str, Any]]) -> str:
    return report.table(
        [
            "side",
            "clients",
            "ok",
            "out tok/s",
            "x 1-at-a-time",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "TTFT p99 after wave 1",
            "ITL p50 ms",
            "ITL p99 ms",
            "mean out tok",
            "same text",
            "others' CPU",
        ],
        [
            [
                r["side"],
                r["clients"],
                f"{r['ok']}/{r['requests']}",
                r["output_tokens_per_s"],
                r["x_one_at_a_time"] if r["x_one_at_a_time"] is not None else float("nan"),
                r["ttft_ms"]["p50"],
                r["ttft_ms"]["p99"],
                r["ttft_after_first_wave_ms"]["p99"],
                r["itl_ms"]["p50"],
                r["itl_ms"]["p99"],
                r["mean_output_tokens"],
                "-"
                if r["same_text_as_one_at_a_time"] is None
                else f"{100 * r['same_text_as_one_at_a_time']:.0f}%",
                f"{100 * r['cpu'].get('others_share', 0):.0f}%",
            ]
            for r in rows
        ],
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the servers this started are stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    gguf = gguf_path(args.model)
    rows, skipped = run_sides(args, gguf)
    result: dict[str, Any] = {
        "benchmark": "generate",
        "model": args.model,
        "gguf": str(gguf),
        "machine": report.machine(args.threads),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "prompts": [{"text": p.text, "max_tokens": p.max_tokens} for p in PROMPTS],
        "llama_cpp_python": llamacpp.VERSION,
        "rows": rows,
        "skipped": skipped,
    }
    print()
    print(table(rows))
    path = report.write_json(f"{args.out}.json", result)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
