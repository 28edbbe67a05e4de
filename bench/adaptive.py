"""Adaptive batching against fixed waits: the worker in-process, real all-MiniLM-L6-v2.

The model is loaded once by the model host (the fleet's cpu profile, ``dtype: auto``
as served); each configuration then gets its own worker on an in-process queue (no
HTTP), and asyncio clients send one TEI request of one text at a time, back to back
(closed loop), texts from ``bench.texts`` (mixed lengths, cut at 256 tokens). The
workers take turns in short rounds (order alternating, figures pooled over rounds),
so a shared machine's slow and fast moments fall on every configuration alike.
Each round puts three loads in a row on a worker, so the controller has to follow
changes of load:

1. moderate: 4 clients for half of ``--duration-s`` (the controller's wait grows);
2. one client: ``--single`` sequential requests, each text first straight through
   the engine (``run_batch`` on one job: no queue, no worker) and then through the
   worker, at the same moment; p50 against p50 (target: <= 1.3x);
3. saturation: ``--clients`` clients for ``--duration-s``: tokens/s against the
   best of the fixed waits (target: no lower).

Configurations: fixed ``max_wait_ms`` in ``--waits-ms`` and the controller
(``--target-ms``, its wait within [0, the profile's max_wait_ms]). The CPU share
other processes took during the run is reported: on a shared machine the figures
are noisy.

    python -m bench.adaptive [--target-ms 20] [--waits-ms 0,1,2,5] [--clients 32] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bench import texts
from bench.report import CpuMeter, machine, percentile, table, wait_for_quiet, write_json
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.execute import LoadedModel, run_batch
from embedder.tasks.fleet import load_fleet
from embedder.host import ModelHost
from embedder.core.jobs import ApiShape, Job, JobResult
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.worker import Worker

MODEL = "all-minilm-l6-v2"
REQUEST_LIMITS = RequestLimits(auto_truncate=True)  # long texts are cut as the engine cuts them
BYTES_PER_TOKEN = 4.0


@dataclass(frozen=True)
class Config:
    name: str
    max_wait_s: float
    target_s: float | None = None


def job_of(text: str) -> Job:
    body = json.dumps({"inputs": [text]}).encode()
    return Job.new(
        MODEL, ApiShape.TEI_EMBED, body, now=time.time(), timeout_s=120.0,
        bytes_per_token=BYTES_PER_TOKEN,
    )  # fmt: skip


@dataclass
class Samples:
    """Everything one configuration measured, pooled over the rounds."""

    latencies: dict[str, list[float]] = field(
        default_factory=lambda: {"moderate": [], "single": [], "engine": [], "saturation": []}
    )
    tokens: dict[str, int] = field(default_factory=lambda: {"moderate": 0, "saturation": 0})
    seconds: dict[str, float] = field(default_factory=lambda: {"moderate": 0.0, "saturation": 0.0})
    waits_ms: dict[str, list[float]] = field(
        default_factory=lambda: {"moderate": [], "single": [], "saturation": []}
    )

    def summary(self) -> dict[str, Any]:
        lat = self.latencies
        out: dict[str, Any] = {}
        for phase in ("moderate", "saturation"):
            out[phase] = {
                "requests": len(lat[phase]),
                "requests_per_s": len(lat[phase]) / self.seconds[phase],
                "tokens_per_s": self.tokens[phase] / self.seconds[phase],
                "p50_ms": 1e3 * percentile(lat[phase], 50),
                "p99_ms": 1e3 * percentile(lat[phase], 99),
                "wait_ms_after_each_round": self.waits_ms[phase],
            }
        out["single"] = {
            "requests": len(lat["single"]),
            "engine_p50_ms": 1e3 * percentile(lat["engine"], 50),
            "p50_ms": 1e3 * percentile(lat["single"], 50),
            "p99_ms": 1e3 * percentile(lat["single"], 99),
            "x_engine": percentile(lat["single"], 50) / percentile(lat["engine"], 50),
            # Each worker request over the engine run just before it: robust to drift.
            "paired_x_engine": percentile(
                [s / e for s, e in zip(lat["single"], lat["engine"], strict=True)], 50
            ),
            "wait_ms_after_each_round": self.waits_ms["single"],
        }
        return out


class Bench:
    """One worker on its own queue for one configuration; closed-loop clients."""

    def __init__(self, model: LoadedModel, config: Config, corpus: Sequence[str]) -> None:
        limits = replace(
            model.limits, max_wait_s=config.max_wait_s, latency_target_s=config.target_s
        )
        self.model = model
        self.queue = InProcessQueue()
        self.worker = Worker(self.queue, {MODEL: replace(model, limits=limits)}, REQUEST_LIMITS)
        self.corpus = corpus
        self.texts = itertools.cycle(corpus)
        self.samples = Samples()

    @property
    def wait_ms(self) -> float:
        return 1e3 * self.worker.limits[MODEL].max_wait_s

    async def one(self, text: str) -> tuple[float, int]:
        start = time.perf_counter()
        answer = await self.queue.put(job_of(text))
        async with asyncio.timeout(60):
            result = await answer
        assert isinstance(result, JobResult)
        return time.perf_counter() - start, result.prompt_tokens

    async def paired(self, count: int) -> None:
        """One client, each text straight through the engine and then through the worker,
        so both see the same moment of a shared machine."""
        for _ in range(count):
            text = next(self.texts)
            self.samples.latencies["engine"].append(direct(self.model, text))
            self.samples.latencies["single"].append((await self.one(text))[0])
        self.samples.waits_ms["single"].append(self.wait_ms)

    async def concurrent(self, phase: str, clients: int, duration_s: float) -> None:
        stop_at = time.perf_counter() + duration_s

        async def client() -> None:
            while time.perf_counter() < stop_at:
                latency, n = await self.one(next(self.texts))
                self.samples.latencies[phase].append(latency)
                self.samples.tokens[phase] += n

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        self.samples.seconds[phase] += time.perf_counter() - start
        self.samples.waits_ms[phase].append(self.wait_ms)

    async def round(self, args: argparse.Namespace) -> None:
        # Every phase starts at the same text for every configuration: the same length mix.
        self.texts = itertools.cycle(self.corpus)
        await self.concurrent("moderate", 4, args.duration_s / 2)
        self.texts = itertools.cycle(self.corpus)
        await self.paired(args.single)
        self.texts = itertools.cycle(self.corpus)
        await self.concurrent("saturation", args.clients, args.duration_s)


def direct(model: LoadedModel, text: str) -> float:
    """One request straight through the engine: decode, tokenize, forward, encode."""
    job = job_of(text)
    start = time.perf_counter()
    report = run_batch((job,), model, REQUEST_LIMITS, time.time())
    elapsed = time.perf_counter() - start
    assert isinstance(report.outcomes[0][1], JobResult)
    return elapsed


async def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus = texts.build(400).texts
    bundled = load_fleet()
    fleet = bundled.model_copy(update={"models": {MODEL: bundled.get(MODEL)}})
    host = ModelHost(fleet, InProcessQueue(), REQUEST_LIMITS, device="cpu", threads=args.threads)
    async with host:
        await host.wait_ready()
        model = host.loaded[MODEL]
        profile_wait_s = model.limits.max_wait_s
        configs = [Config(f"fixed {w:g} ms", w / 1e3) for w in args.waits_ms]
        name = f"controller, target {args.target_ms:g} ms"
        configs.append(Config(name, profile_wait_s, args.target_ms / 1e3))
        benches = [Bench(model, config, corpus) for config in configs]
        for bench in benches:
            await bench.worker.start()
        try:
            warm = Bench(model, configs[0], corpus)
            async with warm.worker:
                await warm.concurrent("saturation", args.clients, 1.0)
            others_before = wait_for_quiet(args.quiet_wait_s)
            meter = CpuMeter()
            # Short rounds, each configuration in turn, order alternating: a shared
            # machine's slow and fast moments fall on every configuration alike.
            for r in range(args.rounds):
                for bench in benches if r % 2 == 0 else benches[::-1]:
                    await bench.round(args)
                print(f"  round {r + 1}/{args.rounds} done", flush=True)
            cpu = meter.result()
        finally:
            for bench in benches:
                await bench.worker.stop()
    results = {c.name: b.samples.summary() for c, b in zip(configs, benches, strict=True)}
    controller = results[name]
    best_fixed = max(
        (c.name for c in configs[:-1]), key=lambda n: results[n]["saturation"]["tokens_per_s"]
    )
    return {
        "benchmark": "adaptive",
        "model": MODEL,
        "machine": machine(args.threads),
        "dtype": model.runtime.info.dtype,
        "args": vars(args),
        "profile_max_wait_ms": 1e3 * profile_wait_s,
        "cpu": cpu,
        "others_share_before": others_before,
        "configs": results,
        "single_ratio": controller["single"]["x_engine"],
        "best_fixed": best_fixed,
        "saturation_ratio": controller["saturation"]["tokens_per_s"]
        / results[best_fixed]["saturation"]["tokens_per_s"],
    }


def report_table(result: dict[str, Any]) -> str:
    rows: list[list[object]] = []
    for name, r in result["configs"].items():
        rows.append(
            [
                name,
                r["moderate"]["tokens_per_s"],
                r["single"]["engine_p50_ms"],
                r["single"]["p50_ms"],
                r["single"]["x_engine"],
                r["single"]["paired_x_engine"],
                r["single"]["wait_ms_after_each_round"][-1],
                r["saturation"]["tokens_per_s"],
                r["saturation"]["p50_ms"],
                r["saturation"]["p99_ms"],
            ]
        )
    headers = [
        "configuration", "4 clients tok/s", "engine p50 ms", "1 client p50 ms", "x engine",
        "paired x", "wait ms",
        f"{result['args']['clients']} clients tok/s", "p50 ms", "p99 ms",
    ]  # fmt: skip
    return table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--target-ms", type=float, default=20.0)
    parser.add_argument(
        "--waits-ms", type=lambda s: [float(w) for w in s.split(",")], default=[0, 1, 2, 5]
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=3.0, help="saturation, per round")
    parser.add_argument("--single", type=int, default=25, help="1-client requests per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--quiet-wait-s", type=float, default=60.0, help="wait this long at most for a quiet CPU"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    result = asyncio.run(run(args))
    print(report_table(result))
    print(
        f"1 client: controller p50 / engine single request = {result['single_ratio']:.3f} "
        "(target <= 1.3)"
    )
    print(
        f"saturation: controller tok/s / best fixed ({result['best_fixed']}) = "
        f"{result['saturation_ratio']:.3f} (target >= 1.0)"
    )
    print(f"other processes' CPU share during the run: {result['cpu'].get('others_share', '?')}")
    print(f"wrote {write_json('adaptive.json', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
