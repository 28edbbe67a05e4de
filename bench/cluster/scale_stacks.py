"""The cluster-scale run's two sides, as child processes: the same emulated workers fed
by a push router or through a pull queue.

A ``Devices`` says what each worker is: its emulated device (``emulation.Device``: its
env) and the models it hosts (its fleet file). Each side starts its workers for a
``Devices`` and stops them when the workloads on it are done:

- push: N ``flotilla serve`` processes (gateway, in-process queue and worker in each),
  and per policy a ``bench.cluster.router`` process with the hosting map;
- pull: a ``PullStack``, chosen by name from ``PULL_STACKS``. ``KafkaStack``: a broker
  (started once), ``flotilla gateway --kafka`` and N ``flotilla worker --kafka`` on
  fresh topics. Another queue substrate is one more class with ``start`` and ``stop``
  (its gateway and worker commands) and one more entry in ``PULL_STACKS``;
  ``serves_subsets`` says whether its workers can pull only the models they host
  (Kafka's cannot: every member of a group must serve the whole fleet).
"""

from __future__ import annotations

import argparse
import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from bench.cluster.emulation import Device, fleet_file
from bench.cluster.processes import Child, Children, wait_until
from bench.cluster.scale_load import MODELS
from bench.load import HOST, free_port

UNLIMITED_TOKENS = 10_000_000  # admission control stays out of the comparison


@dataclass(frozen=True)
class Devices:
    """What the cluster's workers are: a device and a set of hosted models each."""

    name: str
    devices: list[Device]
    hosting: dict[int, list[str]]

    @property
    def subsets(self) -> bool:
        return any(len(models) < len(MODELS) for models in self.hosting.values())


@dataclass
class Side:
    """One side's running processes: where requests go, the workers' /metrics."""

    url: str
    workers: list[Child]
    roles: dict[str, list[int]]  # pids per role, for CPU accounting
    extra: list[Child] = field(default_factory=list)  # its other processes (a gateway)

    def stop(self) -> None:
        for child in [*self.workers, *self.extra]:
            child.proc.terminate()  # all at once: each takes its grace period in parallel
        for child in [*self.workers, *self.extra]:
            child.stop()

    @property
    def metrics_urls(self) -> list[str]:
        return [f"http://{HOST}:{w.port}/metrics" for w in self.workers]


def _common(args: argparse.Namespace, fleet: Path) -> list[str]:
    return [
        "--device",
        "cpu",
        "--log-level",
        "warning",
        "--fleet",
        str(fleet),
        "--max-inflight-tokens",
        str(UNLIMITED_TOKENS),
        "--threads",
        "1",
        "--request-timeout-s",
        str(args.request_timeout_s),
    ]


def _fleets(spec: Any, devices: Devices, logs: Path, tag: str, subsets: bool) -> list[Path]:
    """Each worker's fleet file: its hosted models, or all of them (``subsets`` false)."""
    out = []
    for w in range(len(devices.devices)):
        names = devices.hosting[w] if subsets else list(MODELS)
        out.append(fleet_file(spec, names, logs / f"fleet-{tag}-{w}.yaml"))
    return out


def start_push(
    args: argparse.Namespace, children: Children, spec: Any, devices: Devices, data_dir: Path
) -> Side:
    fleets = _fleets(spec, devices, children.logs, f"push-{devices.name}", True)
    workers = []
    for i, (device, fleet) in enumerate(zip(devices.devices, fleets, strict=True)):
        port = free_port()
        data = str(data_dir / f"push-{devices.name}-{i}")
        flags = [
            "serve",
            "--host",
            HOST,
            "--port",
            str(port),
            "--data-dir",
            data,
            *_common(args, fleet),
        ]
        workers.append(
            children.start(f"push-{devices.name}-{i}", "flotilla", flags, port, device.env())
        )
    return Side("", workers, {"workers": [w.pid for w in workers]})


def start_router(
    children: Children,
    side: Side,
    devices: Devices,
    policy: str,
    refresh_ms: float | None,
    seed: int,
) -> Child:
    import json

    from bench.cluster.emulation import hosts_of

    port = free_port()
    flags = [
        "--port",
        str(port),
        "--policy",
        policy,
        "--seed",
        str(seed),
        *(["--refresh-ms", str(refresh_ms)] if refresh_ms else []),
        *(["--hosting", json.dumps(hosts_of(devices.hosting))] if devices.subsets else []),
        *(f"--worker={w.url}" for w in side.workers),
    ]
    return children.start(f"router-{devices.name}-{policy}", "bench.cluster.router", flags, port)


class PullStack(Protocol):
    name: str
    serves_subsets: bool

    def start(
        self, args: argparse.Namespace, children: Children, spec: Any, devices: Devices
    ) -> Side: ...

    def stop(self) -> None: ...


class KafkaStack:
    """The Kafka work queue: a partitioned request topic, workers in one group."""

    name = "kafka"
    serves_subsets = False

    def __init__(self) -> None:
        self._broker: Any = None
        self.bootstrap = ""
        self.broker_pid: int | None = None

    def _ensure_broker(self, args: argparse.Namespace) -> None:
        if self.bootstrap:
            return
        if args.kafka:
            self.bootstrap = args.kafka
            return
        from tests.kafka.broker import KafkaBroker

        self._broker = KafkaBroker()
        self._broker.start()
        self.bootstrap, self.broker_pid = self._broker.bootstrap, self._broker.pid
        print(f"  Kafka broker up in {self._broker.start_s:.1f} s at {self.bootstrap}")

    def start(
        self, args: argparse.Namespace, children: Children, spec: Any, devices: Devices
    ) -> Side:
        self._ensure_broker(args)
        tag = uuid.uuid4().hex[:8]
        fleets = _fleets(spec, devices, children.logs, f"pull-{devices.name}", False)
        kafka = [
            "--kafka",
            self.bootstrap,
            "--request-topic",
            f"bench-requests-{tag}",
            "--request-partitions",
            str(args.partitions or len(devices.devices)),
            "--worker-group",
            f"bench-workers-{tag}",
            "--status-topic",
            f"bench-status-{tag}",
        ]
        port = free_port()
        flags = [
            "gateway",
            *kafka,
            "--host",
            HOST,
            "--port",
            str(port),
            "--reply-topic-prefix",
            f"bench-replies-{tag}",
            "--gateway-id",
            "bench",
            *_common(args, fleets[0]),
        ]
        gateway = children.start(f"pull-gateway-{devices.name}", "flotilla", flags, port)
        workers = []
        for i, (device, fleet) in enumerate(zip(devices.devices, fleets, strict=True)):
            port = free_port()  # the worker's own /metrics
            flags = ["worker", *kafka, "--worker-port", str(port), *_common(args, fleet)]
            workers.append(
                children.start(f"pull-{devices.name}-{i}", "flotilla", flags, port, device.env())
            )
        roles = {"workers": [w.pid for w in workers], "gateway": [gateway.pid]}
        if self.broker_pid is not None:
            roles["broker"] = [self.broker_pid]
        return Side(gateway.url, workers, roles, [gateway])

    def stop(self) -> None:
        broker, self._broker = self._broker, None
        if broker is not None:
            with contextlib.suppress(Exception):
                broker.stop()


PULL_STACKS: dict[str, type[KafkaStack]] = {"kafka": KafkaStack}


async def wait_workers(
    session: aiohttp.ClientSession, children: Children, side: Side, timeout_s: float
) -> float:
    """Until every worker answers /ready (push: its server; pull: its worker port)."""

    async def ready() -> bool:
        for w in side.workers:
            async with session.get(f"{w.url}/ready") as response:
                if response.status != 200:
                    return False
        return True

    return await wait_until(ready, children, "the workers", timeout_s)


async def wait_gateway(
    session: aiohttp.ClientSession,
    children: Children,
    side: Side,
    models: Sequence[str],
    timeout_s: float,
) -> float:
    """Until the pull gateway sees every worker serving ``models``."""

    async def ready() -> bool:
        async with session.get(f"{side.url}/v1/models") as response:
            data = (await response.json())["data"]
        by_name = {m["id"]: m for m in data}
        return all(
            by_name.get(m, {}).get("state") == "ready"
            and by_name[m].get("workers") == len(side.workers)
            for m in models
        )

    return await wait_until(ready, children, "the pull gateway", timeout_s)


async def wait_router(session: aiohttp.ClientSession, children: Children, router: Child) -> None:
    async def ready() -> bool:
        async with session.get(f"{router.url}/router/ready") as response:
            return response.status == 200

    await wait_until(ready, children, "the router", 30)
