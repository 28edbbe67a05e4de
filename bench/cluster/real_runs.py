"""Measuring the modes on the running stacks.

First the same request both ways (the worst cosine of its vectors: both paths must
agree before their speed means anything) and a short warm-up of each side. Then,
for each level of closed-loop clients, every mode runs for the same time on the
same request sequence (``bench.served``'s client), the order of the modes rotating
from level to level so that drift on a shared machine does not favour one. Each
run records tokens/s, requests/s, latency, errors, the batches the workers ran (from
their ``/metrics``), the CPU each role used and, for push, the router's stats.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp
import numpy as np

from bench import report, served
from bench.cluster.processes import Child
from bench.cluster.real_stacks import Cluster, Mode, get_json, modes, start_router, wait_ready


async def embed(session: aiohttp.ClientSession, url: str, body: bytes) -> Any:
    async with session.post(
        f"{url}/v1/embeddings", data=body, headers={"content-type": "application/json"}
    ) as response:
        response.raise_for_status()
        data = await response.json()
    vectors = np.asarray([item["embedding"] for item in data["data"]], dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


async def run_mode(
    session: aiohttp.ClientSession,
    cluster: Cluster,
    mode: Mode,
    concurrency: int,
    plan: served.Plan,
    args: argparse.Namespace,
    offset: int,
) -> dict[str, Any]:
    """One mode at one level: start its router (push), run the clients, account."""
    roles = dict(cluster.roles)
    router: Child | None = None
    url = cluster.gateway_url
    if mode.policy is not None:
        label = f"{mode.policy}-{mode.refresh_ms or 0:g}ms-c{concurrency}"
        router = await start_router(session, cluster, mode, label, args.seed)
        url = router.url
        roles["router"] = [router.pid]
    if args.wait_quiet_s > 0:
        await asyncio.to_thread(report.wait_for_quiet, args.wait_quiet_s)
    level = served.Level(concurrency=concurrency)
    before_cpu = report.cpu_seconds(roles)
    meter = report.CpuMeter(
        [pid for role, pids in roles.items() if role != "client" for pid in pids]
    )
    counted = cluster.push if router else cluster.pull
    before = await _batches(session, counted)
    await served.run_level(
        session, f"{url}/v1/embeddings", plan, level, args.duration_s, args.max_requests, offset
    )
    level.cpu = meter.result()
    after_cpu = report.cpu_seconds(roles)
    cluster.children.check()
    after = await _batches(session, counted)
    level.batches, level.batch_requests, level.batch_tokens = (
        a - b for a, b in zip(after, before, strict=True)
    )
    result = level.summary(0.0)
    del result["share_of_engine_ceiling"]
    result["cores"] = {
        role: (after_cpu[role] - before_cpu[role]) / level.elapsed_s for role in roles
    }
    result["router"] = None
    if router is not None:
        result["router"] = await get_json(session, f"{url}/router/stats")
        router.stop()
    return {"mode": mode.name, "side": mode.side, "policy": mode.policy,
            "refresh_ms": mode.refresh_ms, **result}  # fmt: skip


async def _batches(
    session: aiohttp.ClientSession, workers: Sequence[Child]
) -> tuple[float, float, float]:
    """Batches, requests and tokens the workers ran so far, from their /metrics."""
    totals = [await served.batch_counters(session, child.port or 0) for child in workers]
    return (
        sum(t[0] for t in totals),
        sum(t[1] for t in totals),
        sum(t[2] for t in totals),
    )


def _line(run: dict[str, Any]) -> str:
    lat = run["latency_ms"]
    return (
        f"  c={run['concurrency']:>3} {run['mode']:<26} {run['ok']:>5} ok "
        f"{run['tokens_per_s']:>8,.0f} tok/s  p50 {lat['p50']:>6,.0f} ms  "
        f"p99 {lat['p99']:>6,.0f} ms  errors {sum(run['errors'].values())}"
    )


async def check_and_warm(
    session: aiohttp.ClientSession, cluster: Cluster, plan: served.Plan, args: argparse.Namespace
) -> float:
    """The same request both ways (the worst cosine of its vectors), then a short load
    on each side so no measured run pays for first batches or new consumers."""
    body = plan.bodies[0]
    push_vectors = await embed(session, cluster.push_urls[0], body)
    pull_vectors = await embed(session, cluster.gateway_url, body)
    cosine = float((push_vectors * pull_vectors).sum(axis=1).min())
    print(f"  the same request both ways: worst cosine {cosine:.6f}")
    warm_ups = [(url, 2) for url in cluster.push_urls] + [(cluster.gateway_url, 2 * args.workers)]
    for url, clients in warm_ups:
        level = served.Level(clients)
        await served.run_level(
            session, f"{url}/v1/embeddings", plan, level, args.warmup_s, args.max_requests, 0
        )
    return cosine


async def measure(
    cluster: Cluster, plan: served.Plan, model: str, args: argparse.Namespace
) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s + 10)
    connector = aiohttp.TCPConnector(limit=0)
    all_modes = modes(args.policies, args.refresh_ms)
    runs: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await wait_ready(session, cluster, args.ready_timeout_s)
        # Both paths must give the same answer before their speed means anything.
        cosine = await check_and_warm(session, cluster, plan, args)
        for i, concurrency in enumerate(args.concurrency):
            # Each level its own stretch of the requests; every mode at a level the same.
            offset = (i * 1009) % len(plan.bodies)
            for j in range(len(all_modes)):
                mode = all_modes[(i + j) % len(all_modes)]
                run = await run_mode(session, cluster, mode, concurrency, plan, args, offset)
                runs.append(run)
                print(_line(run), flush=True)
    return {
        "model": model,
        "cosine_push_vs_pull": cosine,
        "modes": [m.name for m in all_modes],
        "runs": runs,
    }
