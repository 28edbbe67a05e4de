"""What a chaos run serves with, on this machine: the broker (one file-store nats-server,
or a three-node cluster with every stream on each node), one ``flotilla gateway`` and
the ``flotilla worker`` processes on a fresh work-queue stream, and the model's own
vectors for the planned texts, to check every answer against."""

from __future__ import annotations

import argparse
import uuid
from dataclasses import dataclass, field

import aiohttp
import numpy as np
from numpy.typing import NDArray

from bench.cluster.processes import Child, Children, wait_until
from bench.load import HOST, Plan, free_port
from bench.services.nats import NatsCluster
from embedder.tasks.embed.spec import EncoderSpec

CLUSTER_SIZE = 3
REFERENCE_CHUNK = 64  # texts per pass when computing the reference vectors


@dataclass
class Stack:
    broker: NatsCluster
    children: Children
    gateway: Child
    workers: list[Child]
    stream: str
    args: argparse.Namespace
    replaced: list[str] = field(default_factory=list)  # workers killed, by name

    @property
    def url(self) -> str:
        return self.gateway.url

    def replace_worker(self) -> None:
        """SIGKILL the first live worker and start another in its place at once."""
        victim = next(w for w in self.workers if w.alive)
        victim.kill()
        self.replaced.append(victim.name)
        self.workers.append(_worker(self, len(self.workers)))


def new_broker(args: argparse.Namespace) -> NatsCluster:
    return NatsCluster(CLUSTER_SIZE if args.broker == "cluster" else 1)


def start_processes(args: argparse.Namespace, nats: NatsCluster, children: Children) -> Stack:
    """The gateway and ``args.workers`` workers on node 0 of the running ``nats``."""
    tag = uuid.uuid4().hex[:8]
    stream = f"CHAOS_{tag}"
    port = free_port()
    flags = [
        "gateway", *_queue(args, nats, stream), "--host", HOST, "--port", str(port),
        "--reply-topic-prefix", f"chaos-replies-{tag}", "--gateway-id", "chaos",
        "--request-timeout-s", str(args.request_timeout_s),
    ]  # fmt: skip
    gateway = children.start("gateway", "flotilla", flags, port=port)
    stack = Stack(nats, children, gateway, [], stream, args)
    stack.workers = [_worker(stack, i) for i in range(args.workers)]
    return stack


def _queue(args: argparse.Namespace, nats: NatsCluster, stream: str) -> list[str]:
    """The work-queue flags every process shares: file storage, so that a restarted
    broker still holds what was queued; every stream on each node of a cluster."""
    return [
        "--nats", nats.urls, "--nats-stream", stream,
        "--nats-subject-prefix", f"chaos.{stream}", "--nats-storage", "file",
        "--nats-replicas", str(nats.size), "--nats-ack-wait-s", str(args.ack_wait_s),
        "--device", "cpu", "--log-level", "warning",
        *(["--fleet", str(args.fleet)] if args.fleet else []),
    ]  # fmt: skip


def _worker(stack: Stack, n: int) -> Child:
    port = free_port()  # the worker's own /metrics and /ready
    flags = ["worker", *_queue(stack.args, stack.broker, stack.stream),
             "--threads", str(stack.args.threads), "--worker-port", str(port)]  # fmt: skip
    return stack.children.start(f"worker-{n}", "flotilla", flags, port=port)


async def wait_serving(session: aiohttp.ClientSession, stack: Stack, timeout_s: float) -> float:
    """Seconds until the gateway lists the model ready on every worker."""

    async def serving() -> bool:
        async with session.get(f"{stack.url}/v1/models") as response:
            model = (await response.json())["data"][0]
        return bool(model["state"] == "ready" and model["workers"] == len(stack.workers))

    return await wait_until(serving, stack.children, "the gateway and workers", timeout_s)


def reference_vectors(
    spec: EncoderSpec, plan: Plan, threads: int
) -> dict[str, NDArray[np.float32]]:
    """Each planned text's unit vector from the model in this process: what a correct
    answer holds, whatever the fault."""
    from embedder.tasks.embed.runtimes import load_runtime

    runtime = load_runtime(spec, "cpu", threads)
    texts = sorted({text for inputs in plan.texts for text in inputs})
    found: dict[str, NDArray[np.float32]] = {}
    for start in range(0, len(texts), REFERENCE_CHUNK):
        chunk = texts[start : start + REFERENCE_CHUNK]
        vectors = runtime.forward(runtime.tokenize(chunk, "right"))
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        found.update(zip(chunk, vectors.astype(np.float32), strict=True))
    return found
