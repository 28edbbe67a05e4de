"""The cluster-scale run's two sides, as child processes: the same emulated workers fed
by a push router or through a pull queue.

A ``Devices`` says what each worker is: its emulated device (``emulation.Device``: its
env) and the models it hosts (its fleet file). Each side starts its workers for a
``Devices`` and stops them when the workloads on it are done:

- push: N ``flotilla serve`` processes (gateway, in-process queue and worker in each),
  and per push mode K ``bench.cluster.router`` processes with the hosting map, each on
  its own seed (its own polling phase);
- pull: a ``PullStack``, chosen by name from ``PULL_STACKS``. ``JetStreamStack``: a
  nats-server (started once), K ``flotilla gateway --nats`` (each its own reply subject)
  and N ``flotilla worker --nats`` on a fresh stream, each worker pulling only the models
  it hosts, every gateway's fleet naming every model. Another
  queue substrate is one more class with ``start`` and ``stop`` (its gateway and worker
  commands) and one more entry in ``PULL_STACKS``; ``serves_subsets`` says whether its
  workers can pull only the models they host (a partitioned queue cannot: every member
  of a group must serve the whole fleet).
"""

from __future__ import annotations

import argparse
import contextlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from bench.cluster.emulation import Device, fleet_file
from bench.cluster.processes import Child, Children, wait_until
from bench.load import HOST, free_port

UNLIMITED_TOKENS = 10_000_000  # admission control stays out of the comparison


@dataclass(frozen=True)
class Devices:
    """What the cluster's workers are: a device and a set of hosted models each."""

    name: str
    devices: list[Device]
    hosting: dict[int, list[str]]
    models: tuple[str, ...]  # the whole fleet's

    @property
    def subsets(self) -> bool:
        return any(len(models) < len(self.models) for models in self.hosting.values())


@dataclass
class Side:
    """One side's running processes: where requests go (K gateways; push: none, its
    routers are per mode), the workers' /metrics."""

    urls: list[str]
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


def _fleets(spec: Any, devices: Devices, logs: Path, tag: str) -> list[Path]:
    """Each worker's fleet file: the models it hosts."""
    return [
        fleet_file(spec, devices.hosting[w], logs / f"fleet-{tag}-{w}.yaml", device.cost)
        for w, device in enumerate(devices.devices)
    ]


def start_push(
    args: argparse.Namespace, children: Children, spec: Any, devices: Devices, data_dir: Path
) -> Side:
    fleets = _fleets(spec, devices, children.logs, f"push-{devices.name}")
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
    return Side([], workers, {"workers": [w.pid for w in workers]})


@dataclass(frozen=True)
class View:
    """How a push router sees the workers, in wall time (device time x the scale)."""

    refresh_ms: float
    report_delay_ms: float = 0.0


def start_routers(
    children: Children,
    side: Side,
    devices: Devices,
    policy: str,
    view: View | None,
    count: int,
    seed: int,
) -> list[Child]:
    """``count`` independent routers for one push mode: each counts its own sends and,
    seeded apart, polls on its own phase."""
    import json

    from bench.cluster.emulation import hosts_of

    routers = []
    for k in range(count):
        port = free_port()
        flags = [
            "--port",
            str(port),
            "--policy",
            policy,
            "--seed",
            str(seed + 7919 * k),
            *(
                [
                    "--refresh-ms",
                    f"{view.refresh_ms:g}",
                    "--report-delay-ms",
                    f"{view.report_delay_ms:g}",
                ]
                if view
                else []
            ),
            *(["--hosting", json.dumps(hosts_of(devices.hosting))] if devices.subsets else []),
            *(f"--worker={w.url}" for w in side.workers),
        ]
        name = f"router-{devices.name}-{policy}-{len(children.started)}-{k}"
        routers.append(children.start(name, "bench.cluster.router", flags, port))
    return routers


class PullStack(Protocol):
    name: str
    serves_subsets: bool

    def start(
        self,
        args: argparse.Namespace,
        children: Children,
        spec: Any,
        devices: Devices,
        gateways: int,
    ) -> Side: ...

    def stop(self) -> None: ...


class JetStreamStack:
    """The JetStream shared queue: a work-queue stream with subjects per model, each
    worker pulling only the models it hosts from one durable consumer per model."""

    name = "jetstream"
    serves_subsets = True

    def __init__(self) -> None:
        self._server: Any = None
        self.url = ""
        self.server_pid: int | None = None

    def _ensure_server(self, args: argparse.Namespace) -> None:
        if self.url:
            return
        if args.nats:
            self.url = args.nats
            return
        from bench.services.nats import NatsServer

        self._server = NatsServer().start()
        self.url = self._server.url
        self.server_pid = self._server.pid
        print(f"  nats-server up at {self.url}")

    def start(
        self,
        args: argparse.Namespace,
        children: Children,
        spec: Any,
        devices: Devices,
        gateways: int,
    ) -> Side:
        self._ensure_server(args)
        stream = f"BENCH_{uuid.uuid4().hex[:8].upper()}"
        fleets = _fleets(spec, devices, children.logs, f"pull-{devices.name}")
        nats = [
            "--nats",
            self.url,
            "--nats-stream",
            stream,
            "--nats-subject-prefix",
            f"bench.{stream}",
            "--nats-storage",
            "memory",  # the comparison is of queues, not of disks
        ]
        if args.lanes_ms:
            nats += ["--nats-deadline-lanes-ms", ",".join(map(str, args.lanes_ms))]
        fleet = fleet_file(
            spec,
            list(devices.models),
            children.logs / "fleet-gateway.yaml",
            devices.devices[0].cost,
        )
        entry = [
            self._gateway(args, children, fleet, nats, devices.name, k) for k in range(gateways)
        ]
        workers = []
        for i, (device, fleet) in enumerate(zip(devices.devices, fleets, strict=True)):
            port = free_port()  # the worker's own /metrics
            flags = ["worker", *nats, "--worker-port", str(port), *_common(args, fleet)]
            workers.append(
                children.start(f"pull-{devices.name}-{i}", "flotilla", flags, port, device.env())
            )
        roles = {"workers": [w.pid for w in workers], "gateway": [g.pid for g in entry]}
        if self.server_pid is not None:
            roles["broker"] = [self.server_pid]
        return Side([g.url for g in entry], workers, roles, entry)

    @staticmethod
    def _gateway(
        args: argparse.Namespace,
        children: Children,
        fleet: Path,
        nats: list[str],
        name: str,
        k: int,
    ) -> Child:
        """Gateway ``k``: its own port and its own reply subject (``--gateway-id``)."""
        port = free_port()
        flags = [
            "gateway",
            *nats,
            "--host",
            HOST,
            "--port",
            str(port),
            "--gateway-id",
            f"bench-{k}",
            *_common(args, fleet),
        ]
        return children.start(f"pull-gateway-{name}-{k}", "flotilla", flags, port)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(Exception):
                server.stop()


PULL_STACKS: dict[str, type[JetStreamStack]] = {"jetstream": JetStreamStack}


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
    devices: Devices,
    timeout_s: float,
) -> float:
    """Until every pull gateway sees, for every model, each worker that hosts it."""
    hosts = {m: sum(m in names for names in devices.hosting.values()) for m in devices.models}

    async def one(url: str) -> bool:
        async with session.get(f"{url}/v1/models") as response:
            data = (await response.json())["data"]
        by_name = {m["id"]: m for m in data}
        return all(
            by_name.get(m, {}).get("state") == "ready" and by_name[m].get("workers") == count
            for m, count in hosts.items()
        )

    async def ready() -> bool:
        return all([await one(url) for url in side.urls])

    return await wait_until(ready, children, "the pull gateways", timeout_s)


async def wait_routers(
    session: aiohttp.ClientSession, children: Children, routers: list[Child], timeout_s: float
) -> None:
    async def ready() -> bool:
        for router in routers:
            async with session.get(f"{router.url}/router/ready") as response:
                if response.status != 200:
                    return False
        return True

    await wait_until(ready, children, "the routers", timeout_s)
