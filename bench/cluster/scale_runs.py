"""The cluster-scale run's measuring: one workload's modes, interleaved, each searching
for its highest load within the target.

Both sides' processes are up at once for a workload (the workers sleep on their
emulated devices, so 2 x 16 of them idle at no CPU): the pull side with its K gateways,
the push side with K routers per push mode. Nothing restarts between runs, so the modes
can alternate run by run: at each bisection step, for each seed, every mode runs once at
its own current load, in an order that rotates from run to run, and a slow drift of the
machine (other work on its cores) spreads over all modes instead of landing on one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench import report
from bench.cluster.emulation import busy_fractions, forward_seconds
from bench.cluster.processes import Child, Children
from bench.cluster.scale_load import Requests, open_loop
from bench.cluster.scale_report import line
from bench.cluster.scale_search import Bisection, meets_target
from bench.cluster.scale_stacks import Devices, Side, wait_gateway, wait_routers, wait_workers
from bench.cluster.scale_traffic import OF_TARGET

WARM_S = 0.5  # a short load before each run: connections open, queues primed


@dataclass(frozen=True)
class Mode:
    """One way of serving: pull (``policy`` None) or a push policy on a view refreshed
    every ``refresh_ms`` of device time (None: the policy reads no view)."""

    name: str
    policy: str | None = None
    refresh_ms: float | None = None


@dataclass
class Cluster:
    """One workload's running sides and what the runs need to know of it."""

    children: Children
    devices: Devices
    push: Side
    pull: Side | None
    routers: dict[str, list[Child]]  # per push mode, as many as the largest K
    capacity_rps: float
    target_ms: float
    args: argparse.Namespace
    runs: list[dict[str, Any]] = field(default_factory=list)

    def side(self, mode: Mode) -> Side:
        if mode.policy is None:
            assert self.pull is not None
            return self.pull
        return self.push

    def entry(self, mode: Mode, k: int) -> tuple[list[str], dict[str, list[int]]]:
        """Where mode's requests go with ``k`` entry points, and the pids per host role."""
        side = self.side(mode)
        roles = {"client": [os.getpid()], **side.roles}
        if mode.policy is None:
            roles["gateway"] = side.roles["gateway"][:k]
            return [f"{u}/v1/embeddings" for u in side.urls[:k]], roles
        routers = self.routers[mode.name][:k]
        roles["router"] = [r.pid for r in routers]
        return [f"{r.url}/v1/embeddings" for r in routers], roles


def rotated(modes: list[Mode], turn: int) -> list[Mode]:
    """The modes in the order of run ``turn``: each mode leads in turn."""
    k = turn % len(modes) if modes else 0
    return modes[k:] + modes[:k]


async def _scrape(session: aiohttp.ClientSession, side: Side) -> list[float]:
    async def one(url: str) -> float:
        async with session.get(url) as response:
            return forward_seconds(await response.text())

    return list(await asyncio.gather(*(one(u) for u in side.metrics_urls)))


async def measure(
    session: aiohttp.ClientSession,
    cluster: Cluster,
    mode: Mode,
    k: int,
    requests: Requests,
    load: float,
) -> dict[str, Any]:
    """One run: ``mode`` at ``load`` through ``k`` entry points, its device busy
    fractions and the CPU of every host role."""
    args, side = cluster.args, cluster.side(mode)
    urls, roles = cluster.entry(mode, k)
    rate = load * cluster.capacity_rps
    await open_loop(session, urls, requests.sends(rate, WARM_S, cluster.target_ms, k), WARM_S)
    sends = requests.sends(rate, args.duration_s, cluster.target_ms, k)
    before, cpu0, t0 = await _scrape(session, side), report.cpu_seconds(roles), time.perf_counter()
    meter = report.CpuMeter([p for pids in roles.values() for p in pids])
    result = await open_loop(session, urls, sends, args.duration_s)
    wall = time.perf_counter() - t0
    after, cpu1 = await _scrape(session, side), report.cpu_seconds(roles)
    cluster.children.check()
    result.update(
        workload=requests.name,
        mode=mode.name,
        policy=mode.policy,
        gateways=k,
        refresh_ms=mode.refresh_ms,
        load=load,
        rate=rate,
        seed=requests.seed,
        wall_s=wall,
        busy=busy_fractions(before, after, wall),
        cores={r: (cpu1[r] - cpu0[r]) / wall for r in roles},
        machine=meter.result(),
    )
    return result


async def search(
    session: aiohttp.ClientSession,
    cluster: Cluster,
    modes: list[Mode],
    k: int,
    requests: list[Requests],
) -> dict[str, Bisection]:
    """Every mode's bisection at ``k`` entry points, the modes interleaved run by run."""
    searches = {m.name: Bisection(*cluster.args.loads) for m in modes}
    turn = 0
    for step in range(cluster.args.steps):
        for seeded in requests:
            for mode in rotated(modes, turn):
                run = await measure(session, cluster, mode, k, seeded, searches[mode.name].load)
                run["step"] = step
                cluster.runs.append(run)
                print(line(run), flush=True)
            turn += 1
        for mode in modes:
            at_step = [
                r
                for r in cluster.runs
                if r["mode"] == mode.name and r["gateways"] == k and r["step"] == step
            ]
            searches[mode.name].record(meets_target(at_step, cluster.target_ms, OF_TARGET))
    return searches


async def measure_workload(
    cluster: Cluster, modes: list[Mode], requests: list[Requests]
) -> dict[str, Any]:
    """Wait for every process, then search at each K; what each search tried."""
    args = cluster.args
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s + 10)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        took = 0.0
        for side in (cluster.push, cluster.pull):
            if side is not None:
                took += await wait_workers(session, cluster.children, side, args.ready_timeout_s)
        if cluster.pull is not None:
            await wait_gateway(
                session, cluster.children, cluster.pull, cluster.devices, args.ready_timeout_s
            )
        routers = [r for rs in cluster.routers.values() for r in rs]
        await wait_routers(session, cluster.children, routers, args.ready_timeout_s)
        print(f"  workers ready in {took:.1f} s", flush=True)
        found: dict[str, Any] = {}
        for k in args.gateways:
            searches = await search(session, cluster, modes, k, requests)
            found[str(k)] = {m: {"best": b.best, "tried": b.tried} for m, b in searches.items()}
    return found
