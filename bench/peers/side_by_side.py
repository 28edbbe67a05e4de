"""flotilla and a peer server on the same texts and loads, back to back, in one run.

Called by ``bench.served`` while its flotilla server is up. For each peer
configuration (batch size x dtype): start the peer, check its vectors against
SentenceTransformer fp32 on texts that include inputs over the model's limit
(a peer that truncates or pools differently is refused, its numbers never
count), warm it up, then for each load measure flotilla and the peer back to
back, the order alternating between configurations. Tokens are the corpus's
count of every answered request, the same for both sides (a peer's
``usage.prompt_tokens`` need not count model tokens: Infinity counts
characters).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from numpy.typing import NDArray

from bench import load, report, texts
from bench.peers import Peer, PeerConfig, Start
from bench.peers.compare import (
    MIN_COSINE,
    Load,
    Measured,
    accuracy_gate,
    best_config,
    comparison_rows,
    worst_cosine,
)


@dataclass(frozen=True)
class Setup:
    """What both sides share: the flotilla server, the model, the texts, the timing."""

    flotilla_url: str
    model: str  # the fleet's model name: the "model" of every request
    model_dir: Path
    loads: Sequence[Load]
    plans: dict[str, load.Plan]  # load name -> its requests
    check_texts: list[str]
    reference: NDArray[np.float32]  # ST fp32 unit vectors of check_texts
    threads: int
    duration_s: float
    max_requests: int
    warmup_s: float
    request_timeout_s: float
    ready_timeout_s: float
    device: str


def configs(batch_sizes: Sequence[int], dtypes: Sequence[str]) -> list[PeerConfig]:
    return [PeerConfig(f"bs{b}-{d}", b, d) for d in dtypes for b in batch_sizes]


def measured(level: load.Level) -> Measured:
    ms = [s * 1e3 for s in level.latencies_s]
    return Measured(
        tokens_per_s=level.expected_tokens / level.elapsed_s if level.elapsed_s else 0.0,
        p50_ms=report.percentile(ms, 50),
        p99_ms=report.percentile(ms, 99),
        errors=sum(level.errors.values()),
    )


async def _one(
    session: aiohttp.ClientSession, url: str, setup: Setup, at: Load, offset: int
) -> Measured:
    level = load.Level(concurrency=at.clients)
    plan = setup.plans[at.name]
    await load.run_level(session, url, plan, level, setup.duration_s, setup.max_requests, offset)
    return measured(level)


async def _measure_pairs(
    setup: Setup, peer_url: str, flotilla_first: bool
) -> tuple[float, dict[str, Measured], dict[str, Measured]]:
    """The peer's worst cosine to ST fp32; then, when it passes, per load both sides."""
    timeout = aiohttp.ClientTimeout(total=setup.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=max(at.clients for at in setup.loads))
    ours: dict[str, Measured] = {}
    theirs: dict[str, Measured] = {}
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        got = await load.fetch_vectors(session, peer_url, setup.model, setup.check_texts)
        cosine = worst_cosine(got, setup.reference)
        if accuracy_gate(cosine) is not None:
            return cosine, ours, theirs
        warm = load.Level(concurrency=4)
        first = setup.plans[setup.loads[0].name]
        await load.run_level(session, peer_url, first, warm, setup.warmup_s, setup.max_requests, 0)
        for i, at in enumerate(setup.loads):
            offset = 7919 * (i + 1)  # both sides get the same requests, not the warm-up's
            order = ("flotilla", "peer") if flotilla_first == (i % 2 == 0) else ("peer", "flotilla")
            for side in order:
                if side == "flotilla":
                    ours[at.name] = await _one(session, setup.flotilla_url, setup, at, offset)
                else:
                    theirs[at.name] = await _one(session, peer_url, setup, at, offset)
            print(
                f"    {at.name}: flotilla {ours[at.name].tokens_per_s:,.0f} tok/s, "
                f"peer {theirs[at.name].tokens_per_s:,.0f} tok/s"
            )
    return cosine, ours, theirs


def run_peer(
    peer: Peer, peer_configs: Sequence[PeerConfig], setup: Setup, logs: Path
) -> dict[str, Any]:
    """Every configuration of one peer against flotilla; the best one's ratios."""
    results: dict[str, Any] = {"version": peer.version, "configs": {}}
    flotilla_runs: dict[str, dict[str, Measured]] = {}
    peer_runs: dict[str, dict[str, Measured]] = {}
    for n, config in enumerate(peer_configs):
        port = load.free_port()
        log_path = logs / f"{peer.name}-{config.name}.log"
        print(f"  {peer.name} {config.name} on {load.HOST}:{port} (log: {log_path})")
        entry: dict[str, Any] = {"batch_size": config.batch_size, "dtype": config.dtype}
        try:
            start = Start(
                config,
                setup.model_dir,
                setup.model,
                port,
                setup.threads,
                setup.device,
                log_path,
                setup.ready_timeout_s,
            )
            with peer.serve(start) as launch:
                cosine, ours, theirs = asyncio.run(
                    _measure_pairs(setup, launch.url, flotilla_first=n % 2 == 0)
                )
        except (RuntimeError, aiohttp.ClientError, OSError) as exc:
            entry["skipped"] = f"{type(exc).__name__}: {exc}"
            print(f"    skipped: {entry['skipped']}")
            results["configs"][config.name] = entry
            continue
        entry["worst_cosine_vs_st_fp32"] = cosine
        refused = accuracy_gate(cosine)
        if refused is not None:
            entry["refused"] = refused
            print(f"    refused: {refused}")
        else:
            print(f"    vectors vs ST fp32: worst cosine {cosine:.5f}")
            flotilla_runs[config.name], peer_runs[config.name] = ours, theirs
            entry["loads"] = {k: asdict(v) for k, v in theirs.items()}
            entry["flotilla_loads"] = {k: asdict(v) for k, v in ours.items()}
        results["configs"][config.name] = entry
    best = best_config(peer_runs)
    results["best_config"] = best
    results["rows"] = (
        comparison_rows(flotilla_runs[best], peer_runs[best], setup.loads) if best else []
    )
    return results


def table(name: str, results: dict[str, Any]) -> str:
    best = results.get("best_config")
    if not best:
        return f"{name}: no configuration counted (see the lines above)"
    rows = results["rows"]
    head = [
        "load",
        "flotilla tok/s",
        "p50 ms",
        "p99 ms",
        f"{name} tok/s",
        "p50 ms",
        "p99 ms",
        f"flotilla/{name}",
    ]
    body = [
        [
            r["load"],
            r["flotilla_tokens_per_s"],
            r["flotilla_p50_ms"],
            r["flotilla_p99_ms"],
            r["peer_tokens_per_s"],
            r["peer_p50_ms"],
            r["peer_p99_ms"],
            r["ratio_flotilla_over_peer"],
        ]
        for r in rows
    ]
    return f"{name} {results['version']}, best configuration {best}:\n" + report.table(head, body)


def reference_vectors(model_dir: Path, check_texts: list[str], device: str) -> NDArray[np.float32]:
    """SentenceTransformer fp32's unit vectors: what every server's must match."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device=device)
    out = st.encode(check_texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    del st
    return np.asarray(out, dtype=np.float32)


def check_texts_of(corpus_texts: Sequence[str], lengths: Sequence[int], count: int) -> list[str]:
    """The longest quarter (inputs past the model's limit show a peer's truncation)
    and the first of the rest, ``count`` in all."""
    longest = sorted(range(len(lengths)), key=lambda i: -lengths[i])[: max(1, count // 4)]
    rest = [i for i in range(len(corpus_texts)) if i not in set(longest)][: count - len(longest)]
    return [corpus_texts[i] for i in (*longest, *rest)]


def flotilla_cosine(setup: Setup) -> float:
    async def fetch() -> NDArray[np.float32]:
        async with aiohttp.ClientSession() as session:
            return await load.fetch_vectors(
                session, setup.flotilla_url, setup.model, setup.check_texts
            )

    return worst_cosine(asyncio.run(fetch()), setup.reference)


def run_all(
    peers: Sequence[Peer],
    args: argparse.Namespace,
    corpus: texts.Corpus,
    model: str,
    max_tokens: int,
    model_dir: Path,
    flotilla_url: str,
    device: str,
) -> dict[str, Any]:
    """Every chosen peer against the running flotilla server: JSON-ready results."""
    plans = {
        at.name: load.plan_requests(
            corpus, model, max_tokens, 4096, args.seed + at.inputs, "float", (at.inputs, at.inputs)
        )
        for at in args.peer_loads
    }
    check = check_texts_of(corpus.texts, corpus.lengths, args.peer_check_texts)
    setup = Setup(
        flotilla_url=flotilla_url,
        model=model,
        model_dir=model_dir,
        loads=args.peer_loads,
        plans=plans,
        check_texts=check,
        reference=reference_vectors(model_dir, check, device),
        threads=args.threads,
        duration_s=args.peer_duration_s or args.duration_s,
        max_requests=args.max_requests,
        warmup_s=args.warmup_s,
        request_timeout_s=args.request_timeout_s,
        ready_timeout_s=args.ready_timeout_s,
        device=device,
    )
    ours = flotilla_cosine(setup)
    print(f"flotilla's vectors vs ST fp32 on the {len(check)} check texts: worst cosine {ours:.5f}")
    results: dict[str, Any] = {
        "loads": [at.name for at in setup.loads],
        "duration_s": setup.duration_s,
        "check_texts": len(check),
        "min_cosine": MIN_COSINE,
        "flotilla_worst_cosine_vs_st_fp32": ours,
        "tokens": "the corpus's count of each answered request, the same for both sides",
        "peers": {},
    }
    for peer in peers:
        peer_configs = configs(args.peer_batch_sizes, args.peer_dtypes)
        results["peers"][peer.name] = run_peer(peer, peer_configs, setup, report.results_dir())
    return results
