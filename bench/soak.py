"""Soak: mixed traffic against one ``flotilla serve`` for ten minutes.

Closed-loop clients send a weighted mix of the routes users combine: embeddings
(``/v1/embeddings``), rerank (``/rerank``), collection search and document ingest
(``/v1/collections/{name}/search`` and ``.../documents``), all on the fleet's default
model and the same corpus as the other benchmarks. A seed batch of documents goes in
first, so searches have something to find.

It reports errors by route and status, p50/p99 per route in windows over time, and the
server's resident memory over time: after the warm-up it should stay flat (the verdict
line: the peak after warm-up within 10% of the resident size when the warm-up ended).

    flotilla bench soak [--duration-s 600] [--clients 8] [--mix embed=5,rerank=2,search=2,ingest=1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import report, served, texts
from bench.load import HOST, free_port

KINDS = ("embed", "rerank", "search", "ingest")
MEMORY_TOLERANCE = 0.10  # resident memory may grow this much after warm-up


@dataclass
class Sample:
    at_s: float  # since the soak began
    kind: str
    status: int  # 0: the request failed before an answer
    latency_s: float


@dataclass
class Soak:
    samples: list[Sample] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)  # (at_s, bytes)
    failures: Counter[str] = field(default_factory=Counter)  # exceptions by type


def parse_mix(text: str) -> dict[str, float]:
    mix: dict[str, float] = {}
    for part in text.split(","):
        kind, _, weight = part.partition("=")
        if kind not in KINDS or not weight:
            raise argparse.ArgumentTypeError(f"--mix: {part!r}; use KIND=WEIGHT with {KINDS}")
        mix[kind] = float(weight)
    if not any(mix.values()):
        raise argparse.ArgumentTypeError("--mix: some weight must be positive")
    return mix


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flotilla bench soak", description=__doc__)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--warmup-s", type=float, default=120.0, help="memory baseline after it")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--mix", type=parse_mix, default=parse_mix("embed=5,rerank=2,search=2,ingest=1")
    )
    parser.add_argument("--window-s", type=float, default=30.0, help="latency windows")
    parser.add_argument("--rss-every-s", type=float, default=5.0)
    parser.add_argument("--n-texts", type=int, default=2000)
    parser.add_argument("--seed-docs", type=int, default=200)
    parser.add_argument("--collection", default="soak")
    parser.add_argument("--threads", type=int, default=0, help="0: the profile's or every core")
    parser.add_argument("--ready-timeout-s", type=float, default=300.0)
    parser.add_argument("--out", default="soak")
    args = parser.parse_args(argv)
    if args.duration_s <= args.warmup_s:
        parser.error("--duration-s must exceed --warmup-s")
    return args


class Traffic:
    """The request bodies of each kind, drawn from the corpus."""

    def __init__(self, corpus: texts.Corpus, model: str, collection: str, seed: int) -> None:
        self.texts = corpus.texts
        self.model = model
        self.collection = collection
        self.rng = random.Random(seed)
        self.next_doc = 0

    def documents(self, count: int) -> list[dict[str, Any]]:
        docs = []
        for _ in range(count):
            i = self.next_doc % len(self.texts)
            # Ids cycle: later rounds re-ingest documents that exist (the idempotent path).
            docs.append({"id": f"doc-{i}", "text": self.texts[i], "metadata": {"n": i}})
            self.next_doc += 1
        return docs

    def request(self, kind: str) -> tuple[str, str, dict[str, Any]]:
        """(method, path, body) of one request of ``kind``."""
        pick = self.rng.sample
        if kind == "embed":
            inputs = pick(self.texts, self.rng.randint(1, 8))
            return "POST", "/v1/embeddings", {"model": self.model, "input": inputs}
        if kind == "rerank":
            query, *docs = pick(self.texts, self.rng.randint(3, 9))
            body = {"model": self.model, "query": query, "texts": docs, "truncate": True}
            return "POST", "/rerank", body
        if kind == "search":
            body = {"query": self.rng.choice(self.texts), "limit": 10}
            return "POST", f"/v1/collections/{self.collection}/search", body
        body = {"model": self.model, "documents": self.documents(self.rng.randint(1, 8))}
        return "POST", f"/v1/collections/{self.collection}/documents", body


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def run(args: argparse.Namespace, url: str, pid: int, traffic: Traffic) -> Soak:
    soak = Soak()
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=args.clients + 2)
    kinds = [k for k in KINDS if args.mix.get(k)]
    weights = [args.mix[k] for k in kinds]
    async with aiohttp.ClientSession(url, timeout=timeout, connector=connector) as session:
        seed = {"model": traffic.model, "documents": traffic.documents(args.seed_docs)}
        path = f"/v1/collections/{args.collection}/documents"
        async with session.post(path, json=seed) as response:
            if response.status != 200:
                raise SystemExit(
                    f"seeding {path} answered {response.status}: {await response.text()}"
                )
        start = time.perf_counter()
        stop_at = start + args.duration_s

        async def client() -> None:
            while time.perf_counter() < stop_at:
                kind = traffic.rng.choices(kinds, weights)[0]
                method, path, body = traffic.request(kind)
                sent = time.perf_counter()
                try:
                    async with session.request(method, path, json=body) as response:
                        await response.read()
                        status = response.status
                except (aiohttp.ClientError, TimeoutError) as exc:
                    soak.failures[type(exc).__name__] += 1
                    status = 0
                done = time.perf_counter()
                soak.samples.append(Sample(sent - start, kind, status, done - sent))
                if status in (429, 503):
                    await asyncio.sleep(0.05)

        async def memory() -> None:
            while time.perf_counter() < stop_at:
                soak.rss.append((time.perf_counter() - start, resident_bytes(pid)))
                await asyncio.sleep(args.rss_every_s)

        await asyncio.gather(memory(), *(client() for _ in range(args.clients)))
    return soak


def summarize(soak: Soak, args: argparse.Namespace) -> dict[str, Any]:
    errors = {
        kind: dict(
            Counter(str(s.status) for s in soak.samples if s.kind == kind and s.status != 200)
        )
        for kind in KINDS
    }
    counts = Counter(s.kind for s in soak.samples)
    windows: list[dict[str, Any]] = []
    n_windows = int(args.duration_s // args.window_s) + 1
    for w in range(n_windows):
        lo, hi = w * args.window_s, (w + 1) * args.window_s
        row: dict[str, Any] = {"from_s": lo}
        for kind in KINDS:
            ms = [
                s.latency_s * 1e3
                for s in soak.samples
                if s.kind == kind and lo <= s.at_s < hi and s.status == 200
            ]
            row[kind] = {
                "n": len(ms),
                "p50_ms": report.percentile(ms, 50),
                "p99_ms": report.percentile(ms, 99),
            }
        if any(row[k]["n"] for k in KINDS):
            windows.append(row)
    after = [b for t, b in soak.rss if t >= args.warmup_s]
    baseline = next((b for t, b in soak.rss if t >= args.warmup_s), 0)
    growth = (max(after) / baseline - 1.0) if after and baseline else None
    return {
        "requests": dict(counts),
        "ok": sum(1 for s in soak.samples if s.status == 200),
        "errors_by_route_and_status": errors,
        "client_failures": dict(soak.failures),
        "windows": windows,
        "rss_bytes": soak.rss,
        "rss_after_warmup_growth": growth,
        "memory_flat": growth is not None and growth <= MEMORY_TOLERANCE,
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, mem) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for kind in KINDS:
        points = [(w["from_s"], w[kind]["p99_ms"]) for w in summary["windows"] if w[kind]["n"]]
        if points:
            lat.plot(*zip(*points, strict=True), marker="o", label=f"{kind} p99")
    lat.set_ylabel("p99 latency (ms)")
    lat.legend()
    if summary["rss_bytes"]:
        t, rss = zip(*summary["rss_bytes"], strict=True)
        mem.plot(t, [b / 2**20 for b in rss])
    mem.set_ylabel("server resident memory (MiB)")
    mem.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    corpus = texts.build(args.n_texts)
    from embedder.tasks.fleet import load_fleet

    model = load_fleet().default_model  # the server runs the bundled fleet
    port = free_port()
    log_path = report.results_dir() / f"{args.out}-server.log"
    print(f"starting the server on {HOST}:{port} (log: {log_path})")
    with served.server(port, args.threads, log_path, args.ready_timeout_s, None, "cpu") as pid:
        traffic = Traffic(corpus, model, args.collection, seed=7)
        soak = asyncio.run(run(args, f"http://{HOST}:{port}", pid, traffic))
    summary = summarize(soak, args)
    result = {
        "benchmark": "soak",
        "model": model,
        "machine": report.machine(args.threads),
        "args": json.loads(json.dumps(vars(args), default=str)),
        **summary,
    }
    json_path = report.write_json(f"{args.out}.json", result)
    png_path = report.results_dir() / f"{args.out}.png"
    plot(summary, png_path)
    rows = [
        [
            kind,
            summary["requests"].get(kind, 0),
            json.dumps(summary["errors_by_route_and_status"][kind]),
        ]
        for kind in KINDS
    ]
    print(report.table(["route", "requests", "errors by status"], rows))
    growth = summary["rss_after_warmup_growth"]
    verdict = "flat" if summary["memory_flat"] else "NOT flat"
    print(
        f"resident memory after warm-up: {'n/a' if growth is None else f'{100 * growth:+.1f}%'} "
        f"({verdict}; tolerance {100 * MEMORY_TOLERANCE:.0f}%)"
    )
    print(f"wrote {json_path} and {png_path}")
    return result


if __name__ == "__main__":
    main()
