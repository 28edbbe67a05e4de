"""The two stacks the real run compares, as child processes on this machine.

- push: ``start_push``'s N ``flotilla serve`` processes (each its gateway,
  in-process queue and worker), and per run a ``bench.cluster.router`` process in
  front of them (``start_router``) that places each request by the run's policy;
- pull: ``start_pull``'s ``flotilla gateway --nats`` and N ``flotilla worker
  --nats`` on a fresh work-queue stream of a real nats-server.

Both sides get the same model, profile, threads and request timeout, and
admission control lifted (``UNLIMITED_TOKENS``) so that it does not decide the
outcome. A ``Mode`` is one way to serve: pull, or push by a policy at a refresh
period.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.cluster.policies import VIEW_POLICIES
from bench.cluster.processes import Child, Children, wait_until
from bench.load import HOST, free_port

UNLIMITED_TOKENS = 10_000_000  # admission control stays out of the comparison
PULL = "pull (JetStream)"


@dataclass(frozen=True)
class Mode:
    name: str
    policy: str | None = None  # None: pull
    refresh_ms: float | None = None

    @property
    def side(self) -> str:
        return "pull" if self.policy is None else "push"


def modes(policies: Sequence[str], refresh_ms: Sequence[float]) -> list[Mode]:
    out = [Mode(PULL)]
    for policy in policies:
        if policy in VIEW_POLICIES:
            out += [Mode(f"push {policy} R={r:g}ms", policy, r) for r in refresh_ms]
        else:
            out.append(Mode(f"push {policy}", policy))
    return out


@dataclass
class Cluster:
    children: Children
    push: list[Child]
    gateway: Child
    pull: list[Child]
    roles: dict[str, list[int]]  # pids of each role, for CPU accounting

    @property
    def push_urls(self) -> list[str]:
        return [child.url for child in self.push]

    @property
    def gateway_url(self) -> str:
        return self.gateway.url


def start_push(args: argparse.Namespace, children: Children, data_dir: Path) -> list[Child]:
    """N ``flotilla serve`` processes: gateway, in-process queue and worker in each."""
    workers = []
    for i in range(args.workers):
        port = free_port()
        flags = [
            "serve", "--host", HOST, "--port", str(port), "--threads", str(args.threads),
            "--data-dir", str(data_dir / f"push-{i}"), *_common(args),
        ]  # fmt: skip
        workers.append(children.start(f"push-worker-{i}", "flotilla", flags, port=port))
    return workers


def start_pull(args: argparse.Namespace, children: Children, url: str) -> tuple[Child, list[Child]]:
    """``flotilla gateway --nats`` and N ``flotilla worker --nats`` on a fresh stream."""
    tag = uuid.uuid4().hex[:8]
    queue = [
        "--nats", url, "--nats-stream", f"BENCH_{tag}", "--nats-subject-prefix",
        f"bench.{tag}", "--nats-storage", "memory",  # the in-process queue keeps none either
    ]  # fmt: skip
    port = free_port()
    flags = [
        "gateway", *queue, "--host", HOST, "--port", str(port),
        "--reply-topic-prefix", f"bench-replies-{tag}", "--gateway-id", "bench", *_common(args),
    ]  # fmt: skip
    gateway = children.start("pull-gateway", "flotilla", flags, port=port)
    flags = ["worker", *queue, "--threads", str(args.threads), *_common(args)]
    workers = []
    for i in range(args.workers):
        port = free_port()  # the worker's own /metrics: its batch sizes
        workers.append(
            children.start(f"pull-worker-{i}", "flotilla", [*flags, "--worker-port", str(port)],
                           port=port)
        )  # fmt: skip
    return gateway, workers


def _common(args: argparse.Namespace) -> list[str]:
    return [
        "--device", "cpu", "--log-level", "warning",
        "--max-inflight-tokens", str(UNLIMITED_TOKENS),
        "--request-timeout-s", str(args.request_timeout_s),
        *(["--fleet", str(args.fleet)] if args.fleet else []),
    ]  # fmt: skip


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        response.raise_for_status()
        return await response.json()


async def wait_ready(session: aiohttp.ClientSession, cluster: Cluster, timeout_s: float) -> None:
    async def push_ready() -> bool:
        for url in cluster.push_urls:
            async with session.get(f"{url}/ready") as response:
                if response.status != 200:
                    return False
        return True

    async def pull_ready() -> bool:
        model = (await get_json(session, f"{cluster.gateway_url}/v1/models"))["data"][0]
        return bool(model["state"] == "ready" and model["workers"] == len(cluster.pull))

    took = await wait_until(push_ready, cluster.children, "the push workers", timeout_s)
    print(f"  push workers ready after {took:.1f} s")
    took = await wait_until(pull_ready, cluster.children, "the pull gateway and workers", timeout_s)
    print(f"  pull gateway and workers ready {took:.1f} s later")


async def start_router(
    session: aiohttp.ClientSession, cluster: Cluster, mode: Mode, label: str, seed: int
) -> Child:
    assert mode.policy is not None
    port = free_port()
    flags = [
        "--port", str(port), "--policy", mode.policy, "--seed", str(seed),
        *(["--refresh-ms", str(mode.refresh_ms)] if mode.refresh_ms else []),
        *(f"--worker={url}" for url in cluster.push_urls),
    ]  # fmt: skip
    router = cluster.children.start(f"router-{label}", "bench.cluster.router", flags, port=port)
    await wait_until(
        lambda: _ok(session, f"{router.url}/router/ready"), cluster.children, "the router", 30
    )
    return router


async def _ok(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(url) as response:
        return response.status == 200
