"""One request's latency through the JetStream work queue against the in-process queue.

Both stacks run the same emulated device (the model's real tokenizer, a forward that
costs nothing) on the fleet's default model, so what differs is the path a request
takes: ``flotilla serve`` (HTTP, the in-process queue, the worker in one process)
against ``flotilla gateway --nats`` and ``flotilla worker --nats`` over a real
``nats-server`` with JetStream (the test server from ``tests/nats``). One client sends
``--requests`` single-text requests one after another to each, the two alternating in
rounds, and the benchmark reports p50/p90/p99 of each and the difference: what the
shared queue adds to one request.

    flotilla bench queue-latency [--requests 400] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench import report, served, texts
from bench.cluster.processes import Children, wait_until
from bench.hostpath import EMULATED_ENV, emulated
from bench.load import HOST, free_port
from embedder.core.device import cpu_model


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flotilla bench queue-latency", description=__doc__)
    parser.add_argument("--requests", type=int, default=400, help="per path, over all rounds")
    parser.add_argument("--rounds", type=int, default=4, help="the paths alternate per round")
    parser.add_argument("--warmup", type=int, default=30, help="requests per path first")
    parser.add_argument("--n-texts", type=int, default=500)
    parser.add_argument("--ready-timeout-s", type=float, default=180.0)
    parser.add_argument("--out", default="queue_latency")
    args = parser.parse_args(argv)
    if args.requests < args.rounds or args.rounds < 1:
        parser.error("--requests must be at least --rounds, and --rounds at least 1")
    return args


async def _ready(url: str) -> bool:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/ready") as response:
        return response.status == 200


async def _sequential(url: str, model: str, inputs: Sequence[str]) -> list[float]:
    """Seconds per request, one at a time."""
    seconds: list[float] = []
    async with aiohttp.ClientSession() as session:
        for text in inputs:
            body = {"model": model, "input": [text]}
            started = time.perf_counter()
            async with session.post(f"{url}/v1/embeddings", json=body) as response:
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"{url} answered {response.status}: {await response.text()}")
            seconds.append(time.perf_counter() - started)
    return seconds


def _summary(seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1e3 for s in seconds]
    return {f"p{p}_ms": report.percentile(ms, p) for p in (50, 90, 99)} | {"n": len(ms)}


async def measure(args: argparse.Namespace, urls: dict[str, str], model: str) -> dict[str, Any]:
    corpus = texts.build(args.n_texts)
    for url in urls.values():
        await _sequential(url, model, corpus.texts[: args.warmup])
    per_round = args.requests // args.rounds
    seconds: dict[str, list[float]] = {name: [] for name in urls}
    for r in range(args.rounds):
        inputs = corpus.texts[r * per_round : (r + 1) * per_round]
        order = list(urls) if r % 2 == 0 else list(reversed(urls))
        for name in order:
            seconds[name] += await _sequential(urls[name], model, inputs)
    return {name: _summary(values) for name, values in seconds.items()}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from tests.nats.server import NatsServer  # the test server, as bench.ingest uses Kafka's

    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from embedder.tasks.fleet import load_fleet

    fleet = load_fleet()
    spec = emulated(fleet.get(fleet.default_model))
    logs = report.results_dir() / f"{args.out}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    fleet_path = logs / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump(served.one_model_fleet(spec)), encoding="utf-8")
    common = ["--fleet", str(fleet_path), "--device", "cpu", "--threads", "1"]
    common += ["--log-level", "warning"]
    env = {"HF_HUB_OFFLINE": "1", EMULATED_ENV: "0", "FLOTILLA_AUTO_TRUNCATE": "true"}
    with NatsServer() as nats, Children(logs, env) as children:
        inprocess, gateway = free_port(), free_port()
        children.start(
            "serve", "flotilla", ["serve", *common, "--host", HOST, "--port", str(inprocess)]
        )
        queue = ["--nats", nats.url, "--nats-storage", "memory"]
        children.start("worker", "flotilla", ["worker", *common, *queue])
        children.start(
            "gateway",
            "flotilla",
            ["gateway", *common, *queue, "--host", HOST, "--port", str(gateway)],
        )
        urls = {"in-process": f"http://{HOST}:{inprocess}", "jetstream": f"http://{HOST}:{gateway}"}

        async def run() -> dict[str, Any]:
            for name, url in urls.items():
                ready = functools.partial(_ready, url)
                await wait_until(ready, children, name, args.ready_timeout_s)
            return await measure(args, urls, spec.name)

        paths = asyncio.run(run())
    added = {
        key: paths["jetstream"][key] - paths["in-process"][key] for key in ("p50_ms", "p99_ms")
    }
    result = {
        "benchmark": "queue_latency",
        "model": spec.name,
        "device": "emulated (a forward that costs nothing)",
        "machine": report.machine(1),
        "args": json.loads(json.dumps(vars(args), default=str)),
        "paths": paths,
        "jetstream_adds_ms": added,
    }
    path: Path = report.write_json(f"{args.out}.json", result)
    rows = [[name, *(round(v[f"p{p}_ms"], 2) for p in (50, 90, 99))] for name, v in paths.items()]
    print(report.table(["path", "p50 ms", "p90 ms", "p99 ms"], rows))
    print(
        f"JetStream adds {added['p50_ms']:.2f} ms at p50 and {added['p99_ms']:.2f} ms at p99 "
        f"to one request ({cpu_model()}); wrote {path}"
    )
    return result


if __name__ == "__main__":
    main()
