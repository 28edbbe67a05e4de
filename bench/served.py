"""Served benchmark: the real server under concurrent clients.

First the engine ceiling: ``load_runtime`` with the profile the server will run
(the tuned one for this device when the fleet leaves it open),
tokenize + forward over the benchmark's texts in this process, while no
server runs. Then ``python -m flotilla serve`` starts as a subprocess on a
free port of 127.0.0.1 (``FLOTILLA_AUTO_TRUNCATE=true``, so inputs over the
model's 256 tokens are cut as the engine cuts them) and, once ``/ready``
answers, an asyncio load generator (aiohttp) sweeps the number of concurrent
clients. Each client sends ``/v1/embeddings`` requests of 1-8 texts from
``bench.texts`` back to back (closed loop) for a fixed time or count.

Per concurrency: requests/s, tokens/s (from ``usage.prompt_tokens``), latency
p50/p90/p99, errors by status, the server's own queue and inference times
(``x-queue-time``, ``x-inference-time``), and tokens/s as a share of the
engine ceiling. The load generator shares the CPU with the server: on a
2-core machine that costs the server some of its throughput. The printed summary and
the chart: ``bench.served_report``.

    python -m bench.served [--concurrency 1,4,16,64] [--duration-s 15] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import signal
import subprocess
import sys
import time
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from numpy.typing import NDArray

from bench import report, served_report, texts
from bench.candidates import read_profile_file, with_profile
from bench.load import HOST as HOST
from bench.load import MAX_INPUTS as MAX_INPUTS
from bench.load import Level as Level
from bench.load import Plan as Plan
from bench.load import batch_counters as batch_counters
from bench.load import check_vectors as check_vectors
from bench.load import free_port as free_port
from bench.load import plan_requests as plan_requests
from bench.load import run_level as run_level
from bench.peers import Peer, options, side_by_side
from embedder.core.device import fingerprint
from embedder.core.fleet import DeviceKind, Precision, entry_as
from embedder.tasks.embed.spec import EncoderSpec
from embedder.tuned import ProfileChoice, load_tuned, profile_for

# -- the engine ceiling ------------------------------------------------------


@dataclass(frozen=True)
class Ceiling:
    tokens_per_s: float  # full server-sized batches: what a saturated worker could reach
    reps: list[float]
    one_call_tokens_per_s: float  # every text in one call, sorted globally: no server can
    batches: int
    mean_requests_per_batch: float
    mean_tokens_per_batch: float
    dtype: str
    check_vectors: NDArray[np.float32]  # unit vectors of the first request-sized input


def server_batches(
    plan: Plan, max_tokens: int, max_requests: int, bytes_per_token: float
) -> list[list[int]]:
    """Consecutive requests grouped as the worker groups them at most: up to
    ``max_tokens`` estimated tokens (body bytes / bytes_per_token) and ``max_requests``."""
    batches: list[list[int]] = []
    current: list[int] = []
    budget = 0
    for i, body in enumerate(plan.bodies):
        estimate = max(1, math.ceil(len(body) / bytes_per_token))
        if current and (budget + estimate > max_tokens or len(current) >= max_requests):
            batches.append(current)
            current, budget = [], 0
        current.append(i)
        budget += estimate
    if current:
        batches.append(current)
    return batches


def engine_ceiling(
    spec: EncoderSpec, device: DeviceKind, plan: Plan, threads: int, reps: int, min_tokens: int
) -> Ceiling:
    """Tokenize + forward in this process, no server running, over the planned
    requests grouped into full server-sized batches (median of ``reps``); also
    the same texts in one call. ``spec`` carries the profile the server runs."""
    import torch

    from embedder.tasks.embed.runtimes import load_runtime
    from flotilla.settings import Settings

    profile = spec.profile(device)
    runtime = load_runtime(spec, device, threads)
    torch.set_num_threads(threads)
    grouped = server_batches(
        plan, profile.max_batch_tokens, profile.max_batch_requests, Settings().bytes_per_token
    )
    batches: list[list[str]] = []
    tokens = 0
    for rows in grouped:
        batches.append([text for i in rows for text in plan.texts[i]])
        tokens += sum(plan.tokens[i] for i in rows)
        if tokens >= min_tokens:
            break
    runtime.forward(runtime.tokenize(batches[0], "right"))  # warm up
    rates: list[float] = []
    for _ in range(reps):
        start = time.perf_counter()
        for batch in batches:
            runtime.forward(runtime.tokenize(batch, "right"))
        rates.append(tokens / (time.perf_counter() - start))
    every = [text for batch in batches for text in batch]
    start = time.perf_counter()
    runtime.forward(runtime.tokenize(every, "right"))
    one_call = tokens / (time.perf_counter() - start)
    check = runtime.forward(runtime.tokenize(plan.texts[0], "right"))
    ceiling = Ceiling(
        tokens_per_s=report.median(rates),
        reps=rates,
        one_call_tokens_per_s=one_call,
        batches=len(batches),
        mean_requests_per_batch=sum(map(len, grouped[: len(batches)])) / len(batches),
        mean_tokens_per_batch=tokens / len(batches),
        dtype=runtime.info.dtype,
        check_vectors=(check / np.linalg.norm(check, axis=1, keepdims=True)).astype(np.float32),
    )
    del runtime
    gc.collect()
    return ceiling


# -- the server --------------------------------------------------------------


@contextlib.contextmanager
def server(
    port: int,
    threads: int,
    log_path: Path,
    ready_timeout_s: float,
    fleet: Path | None = None,
    device: str = "auto",
    settings: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
    log_level: str = "warning",
) -> Iterator[int]:
    """``flotilla serve`` in a subprocess, with ``settings`` (``FLOTILLA_*`` variables)
    beside the benchmarks' own, after ``prefix`` (``taskset -c 0``, say); yields its pid
    once /ready answers 200."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "FLOTILLA_AUTO_TRUNCATE": "true",
        **(settings or {}),
    }
    command = [
        *prefix,
        sys.executable,
        "-m",
        "flotilla",
        "serve",
        "--host",
        HOST,
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--log-level",
        log_level,
        "--device",
        device,
        *(["--fleet", str(fleet)] if fleet is not None else []),
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            try:
                asyncio.run(_wait_ready(process, port, ready_timeout_s, log_path))
            except SystemExit:
                sys.stderr.write(log_path.read_text(errors="replace")[-3000:])
                raise
            yield process.pid
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


async def _wait_ready(
    process: subprocess.Popen[bytes], port: int, timeout_s: float, log_path: Path
) -> None:
    deadline = time.monotonic() + timeout_s
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(
                    f"the server exited with {process.returncode}; its log: {log_path}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"http://{HOST}:{port}/ready") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.25)
    raise SystemExit(f"the server was not ready within {timeout_s:.0f} s; see {log_path}")


async def sweep(
    port: int,
    server_pid: int,
    args: argparse.Namespace,
    plan: Plan,
    model: str,
    expected: NDArray[np.float32],
) -> tuple[list[Level], float, dict[str, Any]]:
    url = f"http://{HOST}:{port}/v1/embeddings"
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=max(args.concurrency))
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        async with session.get(f"http://{HOST}:{port}/v1/models") as response:
            served = await response.json()
        cosine = await check_vectors(session, url, model, plan.texts[0], expected)
        warm = Level(concurrency=min(4, max(args.concurrency)))
        await run_level(session, url, plan, warm, args.warmup_s, args.max_requests, 0)
        print(f"warm-up: {warm.ok} requests in {warm.elapsed_s:.1f} s")
        levels: list[Level] = []
        offset = warm.sent
        for concurrency in args.concurrency:
            level = Level(concurrency=concurrency)
            if args.wait_quiet_s > 0:
                await asyncio.to_thread(report.wait_for_quiet, args.wait_quiet_s)
            meter = report.CpuMeter([server_pid])
            before = await batch_counters(session, port)
            await run_level(session, url, plan, level, args.duration_s, args.max_requests, offset)
            level.cpu = meter.result()
            after = await batch_counters(session, port)
            level.batches, level.batch_requests, level.batch_tokens = (
                a - b for a, b in zip(after, before, strict=True)
            )
            offset += level.sent
            levels.append(level)
            ms = sorted(level.latencies_s)
            print(
                f"  c={concurrency:>3}: {level.ok} ok in {level.elapsed_s:.1f} s, "
                f"{level.tokens / level.elapsed_s:,.0f} tokens/s, "
                f"p50 {1e3 * report.percentile(ms, 50):.0f} ms, "
                f"p99 {1e3 * report.percentile(ms, 99):.0f} ms, errors {dict(level.errors)}"
            )
    return levels, cosine, served


def _levels(value: str) -> list[int]:
    levels = [int(v) for v in value.split(",") if v.strip()]
    if not levels or any(n <= 0 or n > 1024 for n in levels):
        raise argparse.ArgumentTypeError("concurrency levels are integers in 1..1024")
    return levels


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.served",
        description="The real server under concurrent clients, against the engine ceiling.",
    )
    parser.add_argument("--concurrency", type=_levels, default=[1, 4, 16, 64])
    parser.add_argument("--duration-s", type=float, default=15.0, help="per concurrency level")
    parser.add_argument(
        "--max-requests", type=int, default=5000, help="per concurrency level, at most"
    )
    parser.add_argument("--warmup-s", type=float, default=4.0)
    parser.add_argument("--n-texts", type=int, default=1000, help="passages in the corpus")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--ceiling-tokens", type=int, default=40_000, help="tokens the ceiling runs per rep"
    )
    parser.add_argument("--ceiling-reps", type=int, default=3)
    parser.add_argument("--encoding", choices=("float", "base64"), default="float")
    parser.add_argument("--request-timeout-s", type=float, default=60.0)
    parser.add_argument("--ready-timeout-s", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=texts.SEED)
    parser.add_argument(
        "--wait-quiet-s",
        type=float,
        default=0.0,
        help="on a shared machine, wait up to this long for other processes to go quiet",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the server and the ceiling run (the fleet's profile for it)",
    )
    parser.add_argument(
        "--fleet-profile",
        type=Path,
        default=None,
        help="a YAML or JSON file of profile fields the server runs over the fleet's profile",
    )
    parser.add_argument("--runtime", default=None, help="override the profile's runtime")
    parser.add_argument(
        "--dtype", choices=typing.get_args(Precision), default=None, help="override its dtype"
    )
    options.add_arguments(parser)
    parser.add_argument("--out", default="served", help="results file stem in bench/results/")
    args = parser.parse_args(argv)
    if args.duration_s <= 0 or args.duration_s > 600 or args.max_requests <= 0:
        parser.error("--duration-s must be in (0, 600] and --max-requests positive")
    return args


def one_model_fleet(spec: EncoderSpec) -> dict[str, Any]:
    """A fleet file of ``spec`` alone, with only the fields its fleet set: a field written
    out is a choice made (naming the runtime pins it), which would keep the server off
    its tuned profile."""
    return {
        "models": {spec.name: spec.model_dump(mode="json", exclude={"name"}, exclude_unset=True)}
    }


def served_spec(args: argparse.Namespace) -> EncoderSpec:
    """The fleet's default model with the profile for ``--device`` overridden by
    ``--fleet-profile``, then ``--runtime`` / ``--dtype``."""
    from embedder.tasks.fleet import load_fleet

    fleet = load_fleet()
    spec = entry_as(fleet.get(fleet.default_model), EncoderSpec)
    changes: dict[str, Any] = {}
    if args.fleet_profile is not None:
        changes.update(read_profile_file(args.fleet_profile))
    if args.runtime is not None:
        changes["runtime"] = args.runtime
    if args.dtype is not None:
        changes["dtype"] = args.dtype
    try:
        return with_profile(spec, args.device, **changes) if changes else spec
    except ValueError as exc:
        raise SystemExit(f"the profile override is invalid: {exc}") from None


def ceiling_for(
    spec: EncoderSpec, plan: Plan, args: argparse.Namespace
) -> tuple[ProfileChoice, Ceiling, dict[str, float]]:
    """The profile the server will run, the engine's ceiling with it, and the machine's
    CPU use while the ceiling ran."""
    if args.wait_quiet_s > 0:
        report.wait_for_quiet(args.wait_quiet_s)
    print("engine ceiling: tokenize + forward of full server-sized batches, no server running")
    meter = report.CpuMeter()
    # The ceiling runs what the server will run: the tuned profile for this device
    # when the fleet leaves it open, with that profile's threads.
    choice = profile_for(spec, args.device, fingerprint(args.device), load_tuned())
    print(f"  {choice.source} profile: {choice.why}")
    engine = engine_ceiling(
        choice.apply(spec, args.device),
        args.device,
        plan,
        choice.profile.threads or args.threads,
        args.ceiling_reps,
        args.ceiling_tokens,
    )
    ceiling_cpu = meter.result()
    print(
        f"  {engine.tokens_per_s:,.0f} tokens/s ({engine.dtype}) over {engine.batches} batches "
        f"of {engine.mean_requests_per_batch:.1f} requests, "
        f"{engine.mean_tokens_per_batch:,.0f} tokens; reps {[round(r) for r in engine.reps]}; "
        f"the same texts in one call: {engine.one_call_tokens_per_s:,.0f} tokens/s"
    )
    return choice, engine, ceiling_cpu


@dataclass
class Served:
    """What the running server gave: its levels, its vectors' worst cosine to the engine's,
    its /v1/models answer, and the peers' side-by-side runs (None without peers)."""

    levels: list[Level]
    cosine: float
    models: dict[str, Any]
    peers: dict[str, Any] | None


def serve_and_sweep(
    spec: EncoderSpec,
    args: argparse.Namespace,
    plan: Plan,
    corpus: texts.Corpus,
    peers: Sequence[Peer],
    expected: NDArray[np.float32],
) -> Served:
    """``flotilla serve`` on the measured model alone, swept over the concurrency levels;
    then, while it still runs, each peer against it on the same texts and loads."""
    port = free_port()
    log_path = report.results_dir() / f"{args.out}-server.log"
    # The server loads only the measured model: others of the bundled fleet would only
    # delay /ready and take memory.
    fleet_path = log_path.with_name(f"{args.out}-fleet.yaml")
    fleet_path.write_text(yaml.safe_dump(one_model_fleet(spec)), encoding="utf-8")
    print(f"starting the server on {HOST}:{port} (log: {log_path})")
    started = time.perf_counter()
    with server(port, args.threads, log_path, args.ready_timeout_s, fleet_path, args.device) as pid:
        print(f"  ready after {time.perf_counter() - started:.1f} s")
        levels, cosine, models = asyncio.run(sweep(port, pid, args, plan, spec.name, expected))
        if not peers:
            return Served(levels, cosine, models, None)
        print("peers: the same texts and loads, flotilla and each peer back to back")
        compared = side_by_side.run_all(
            peers,
            args,
            corpus,
            spec.name,
            spec.max_tokens,
            spec.source.resolve(),
            f"http://{HOST}:{port}/v1/embeddings",
            args.device,
        )
    return Served(levels, cosine, models, compared)


def engine_section(engine: Ceiling, cpu: dict[str, float]) -> dict[str, Any]:
    return {
        "tokens_per_s": engine.tokens_per_s,
        "what": "tokenize + forward of consecutive requests grouped into full batches "
        "(the cpu profile's max_batch_tokens / max_batch_requests), no server running",
        "reps": engine.reps,
        "one_call_tokens_per_s": engine.one_call_tokens_per_s,
        "batches": engine.batches,
        "mean_requests_per_batch": engine.mean_requests_per_batch,
        "mean_tokens_per_batch": engine.mean_tokens_per_batch,
        "dtype": engine.dtype,
        "cpu": cpu,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = served_spec(args)
    peers = options.chosen_peers(args.peer)
    corpus = texts.build(args.n_texts, args.seed)
    plan = plan_requests(corpus, spec.name, spec.max_tokens, 4096, args.seed, args.encoding)
    choice, engine, ceiling_cpu = ceiling_for(spec, plan, args)
    served = serve_and_sweep(spec, args, plan, corpus, peers, engine.check_vectors)
    rows = [level.summary(engine.tokens_per_s) for level in served.levels]
    result: dict[str, Any] = {
        "benchmark": "served",
        "model": spec.name,
        "machine": report.machine(args.threads),
        "args": json.loads(json.dumps(vars(args), default=str)),  # paths, loads: as text
        "requests": {
            "inputs_per_request": f"1-{MAX_INPUTS}, uniform",
            "mean_inputs": float(np.mean([len(t) for t in plan.texts])),
            "mean_tokens": float(np.mean(plan.tokens)),
            "encoding_format": args.encoding,
        },
        "engine_ceiling": engine_section(engine, ceiling_cpu),
        "server_models": served.models.get("data", []),
        "served_vs_engine_worst_cosine": served.cosine,
        "levels": rows,
        "profile": choice.profile.model_dump(),
        "profile_choice": choice.describe(),
        "peers": served.peers,
    }
    served_report.print_summary(result)
    json_path = report.write_json(f"{args.out}.json", result)
    png_path = report.results_dir() / f"{args.out}.png"
    title = f"flotilla serve, {spec.name}, /v1/embeddings with 1-{MAX_INPUTS} mixed texts; "
    title += f"{result['machine']['cpu']}, {args.threads} threads"
    served_report.plot(rows, engine.tokens_per_s, str(png_path), title)
    print(f"wrote {json_path} and {png_path}")
    return result


if __name__ == "__main__":
    main()
