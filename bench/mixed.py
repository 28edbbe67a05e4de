"""Mixed fleet: an embedder and a chat model served on one device, each under the
other's load.

One ``flotilla serve`` hosts both models (the bundled embedder and the bundled chat
model, on one CPU), and three phases of ``--duration-s`` each run against it:

- ``embed``: embedding requests alone, open loop at ``--embed-rate`` requests/s (the
  same offered load in every phase, so a slower answer cannot lower it), 1-4 corpus
  texts each;
- ``chat``: ``--chat-clients`` closed-loop streaming chat clients alone (the fixed
  prompts of ``bench.generate``);
- ``both``: the two loads at once.

Reported: embedding latency p50/p99 and chat TTFT, ITL and per-token p50/p99 per
phase, and each one's p99 under the other's load over its p99 alone (the target is at
most 2x). JSON and a table to ``bench/results/``.

    python -m bench.mixed [--duration-s 30] [--embed-rate 8] [--chat-clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yaml

from bench import report, texts
from bench.generation.client import Stream, stream_once
from bench.generation.load import summarize
from bench.generation.prompts import PROMPTS, body
from bench.load import HOST, free_port, plan_requests

PHASES = ("embed", "chat", "both")


@dataclass
class EmbedLoad:
    """Open-loop embedding requests and what they saw."""

    latencies_ms: list[float] = field(default_factory=list)
    queue_ms: list[float] = field(default_factory=list)  # the server's x-queue-time
    inference_ms: list[float] = field(default_factory=list)  # and x-inference-time
    errors: dict[str, int] = field(default_factory=dict)
    sent: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.sent,
            "ok": len(self.latencies_ms),
            "errors": self.errors,
            "latency_ms": {
                "p50": report.percentile(self.latencies_ms, 50),
                "p99": report.percentile(self.latencies_ms, 99),
                "max": max(self.latencies_ms, default=float("nan")),
            },
            "server_queue_ms": {
                "p50": report.percentile(self.queue_ms, 50),
                "p99": report.percentile(self.queue_ms, 99),
            },
            "server_inference_ms": {
                "p50": report.percentile(self.inference_ms, 50),
                "p99": report.percentile(self.inference_ms, 99),
            },
        }


async def embed_open_loop(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[bytes],
    rate: float,
    duration_s: float,
) -> EmbedLoad:
    """A request every ``1 / rate`` seconds for ``duration_s``, each timed from its
    planned send time (a late send counts against the server, not hidden)."""
    load = EmbedLoad()
    start = time.perf_counter()

    async def one(i: int, planned: float) -> None:
        try:
            async with session.post(
                url, data=bodies[i % len(bodies)], headers={"content-type": "application/json"}
            ) as response:
                await response.read()
                status = response.status
                headers = response.headers
        except (aiohttp.ClientError, TimeoutError) as exc:
            load.errors[type(exc).__name__] = load.errors.get(type(exc).__name__, 0) + 1
            return
        if status != 200:
            load.errors[str(status)] = load.errors.get(str(status), 0) + 1
            return
        load.latencies_ms.append(1e3 * (time.perf_counter() - planned))
        with contextlib.suppress(KeyError, ValueError):
            load.queue_ms.append(float(headers["x-queue-time"]))
            load.inference_ms.append(float(headers["x-inference-time"]))

    tasks = []
    for i in itertools.count():
        planned = start + i / rate
        if planned - start >= duration_s:
            break
        await asyncio.sleep(max(0.0, planned - time.perf_counter()))
        load.sent += 1
        tasks.append(asyncio.create_task(one(i, planned)))
    await asyncio.gather(*tasks)
    return load


async def chat_closed_loop(
    session: aiohttp.ClientSession, url: str, model: str, clients: int, duration_s: float
) -> list[Stream]:
    """``clients`` streaming clients back to back; none starts a request after
    ``duration_s``. In the order the requests were taken."""
    counter = itertools.count()
    streams: dict[int, Stream] = {}
    stop_at = time.perf_counter() + duration_s

    async def client() -> None:
        while time.perf_counter() < stop_at:
            k = next(counter)
            request = body(PROMPTS[k % len(PROMPTS)], model)
            streams[k] = await stream_once(session, url, request, timeout_s=600)

    await asyncio.gather(*(client() for _ in range(clients)))
    return [streams[k] for k in sorted(streams)]


def chat_summary(streams: Sequence[Stream], clients: int) -> dict[str, Any]:
    row = summarize(streams, clients)
    tpot = [1e3 * t for s in streams if s.ok and (t := s.time_per_output_token_s) is not None]
    row["tpot_ms"] = {"p50": report.percentile(tpot, 50), "p99": report.percentile(tpot, 99)}
    return row


async def run_phase(
    phase: str, args: argparse.Namespace, port: int, bodies: Sequence[bytes]
) -> dict[str, Any]:
    base = f"http://{HOST}:{port}/v1"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        meter = report.CpuMeter()
        embed = chat = None
        loads: list[Any] = []
        if phase in ("embed", "both"):
            embed = asyncio.create_task(
                embed_open_loop(
                    session, f"{base}/embeddings", bodies, args.embed_rate, args.duration_s
                )
            )
            loads.append(embed)
        if phase in ("chat", "both"):
            chat = asyncio.create_task(
                chat_closed_loop(
                    session,
                    f"{base}/chat/completions",
                    args.chat_model,
                    args.chat_clients,
                    args.duration_s,
                )
            )
            loads.append(chat)
        await asyncio.gather(*loads)
        row: dict[str, Any] = {"phase": phase, "cpu": meter.result()}
        if embed is not None:
            row["embed"] = embed.result().summary()
        if chat is not None:
            row["chat"] = chat_summary(chat.result(), args.chat_clients)
        return row


def ratios(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each load's p99 with the other running over its p99 alone."""
    by = {r["phase"]: r for r in rows}
    out: dict[str, float] = {}
    if {"embed", "both"} <= by.keys():
        alone = by["embed"]["embed"]["latency_ms"]["p99"]
        out["embed_latency_p99"] = by["both"]["embed"]["latency_ms"]["p99"] / alone
    if {"chat", "both"} <= by.keys():
        for metric in ("ttft_ms", "itl_ms", "tpot_ms"):
            alone = by["chat"]["chat"][metric]["p99"]
            out[f"chat_{metric[:-3]}_p99"] = by["both"]["chat"][metric]["p99"] / alone
    return out


def fleet_file(args: argparse.Namespace, path: Any) -> None:
    """The two models alone, as their fleet sets them."""
    from embedder.tasks.fleet import load_fleet

    fleet = load_fleet(args.fleet)
    models = {}
    for name in (args.embed_model, args.chat_model):
        spec = fleet.get(name)
        models[spec.name] = spec.model_dump(mode="json", exclude={"name"}, exclude_unset=True)
    path.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="flotilla bench mixed",
        description="An embedder and a chat model on one device, each under the other's load.",
    )
    parser.add_argument("--duration-s", type=float, default=30.0, help="per phase")
    parser.add_argument("--embed-rate", type=float, default=8.0, help="embedding requests/s")
    parser.add_argument("--chat-clients", type=int, default=8)
    parser.add_argument("--embed-model", default="all-minilm-l6-v2")
    parser.add_argument("--chat-model", default="smollm2-135m-instruct")
    parser.add_argument("--fleet", default=None, help="fleet file (default: the bundled one)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--phases", default=",".join(PHASES), help=", ".join(PHASES))
    parser.add_argument("--warmup-s", type=float, default=5.0, help="both loads, unmeasured")
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument("--wait-quiet-s", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default="mixed")
    args = parser.parse_args(argv)
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not set(args.phases) <= set(PHASES) or not args.phases:
        parser.error(f"--phases takes some of {', '.join(PHASES)}")
    if args.duration_s <= 0 or args.embed_rate <= 0 or args.chat_clients <= 0:
        parser.error("--duration-s, --embed-rate and --chat-clients must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from bench.served import server

    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embedder.tasks.fleet import load_fleet

    embed_spec = load_fleet(args.fleet).get(args.embed_model)
    corpus = texts.build(512, args.seed)
    plan = plan_requests(
        corpus, embed_spec.name, embed_spec.max_tokens, 1024, args.seed, "float", (1, 4)
    )
    log_path = report.results_dir() / f"{args.out}-server.log"
    fleet_path = log_path.with_name(f"{args.out}-fleet.yaml")
    fleet_file(args, fleet_path)
    if args.wait_quiet_s > 0:
        report.wait_for_quiet(args.wait_quiet_s)
    port = free_port()
    rows: list[dict[str, Any]] = []
    with server(port, args.threads, log_path, args.ready_timeout_s, fleet_path, "cpu"):
        if args.warmup_s > 0:
            warm = argparse.Namespace(**{**vars(args), "duration_s": args.warmup_s})
            asyncio.run(run_phase("both", warm, port, plan.bodies))
        for phase in args.phases:
            row = asyncio.run(run_phase(phase, args, port, plan.bodies))
            rows.append(row)
            print(f"  {phase}: {line(row)}")
    result = {
        "benchmark": "mixed",
        "machine": report.machine(args.threads),
        "args": {k: v for k, v in vars(args).items()},
        "rows": rows,
        "p99_under_other_load_over_alone": ratios(rows),
    }
    path = report.write_json(f"{args.out}.json", result)
    print(table(rows))
    print(
        "p99 under the other load / alone:", json.dumps(result["p99_under_other_load_over_alone"])
    )
    print(f"wrote {path}")
    return result


def line(row: dict[str, Any]) -> str:
    parts = []
    if "embed" in row:
        e = row["embed"]
        parts.append(
            f"embed {e['ok']}/{e['requests']} ok, p50 {e['latency_ms']['p50']:.0f} ms "
            f"p99 {e['latency_ms']['p99']:.0f} ms (server queue p50 "
            f"{e['server_queue_ms']['p50']:.0f} ms, inference p50 "
            f"{e['server_inference_ms']['p50']:.0f} ms)"
        )
    if "chat" in row:
        c = row["chat"]
        parts.append(
            f"chat {c['ok']}/{c['requests']} ok, {c['output_tokens_per_s']:.1f} tok/s, TTFT p99 "
            f"{c['ttft_ms']['p99']:.0f} ms, ITL p99 {c['itl_ms']['p99']:.0f} ms"
        )
    return "; ".join(parts)


def table(rows: Sequence[dict[str, Any]]) -> str:
    nan = float("nan")

    def get(row: dict[str, Any], *keys: str) -> Any:
        value: Any = row
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                return nan
            value = value[key]
        return value

    return report.table(
        [
            "phase",
            "embed p50 ms",
            "embed p99 ms",
            "chat tok/s",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "ITL p50 ms",
            "ITL p99 ms",
            "TPOT p99 ms",
        ],
        [
            [
                r["phase"],
                get(r, "embed", "latency_ms", "p50"),
                get(r, "embed", "latency_ms", "p99"),
                get(r, "chat", "output_tokens_per_s"),
                get(r, "chat", "ttft_ms", "p50"),
                get(r, "chat", "ttft_ms", "p99"),
                get(r, "chat", "itl_ms", "p50"),
                get(r, "chat", "itl_ms", "p99"),
                get(r, "chat", "tpot_ms", "p99"),
            ]
            for r in rows
        ],
    )


if __name__ == "__main__":
    main()
