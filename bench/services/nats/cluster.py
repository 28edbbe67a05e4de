"""N clustered ``nats-server -js`` on loopback, for replicated streams and broker faults:
each node keeps its name, ports and store across kills and restarts, as a machine would."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import nats

from bench.services.nats.server import (
    HOST,
    MAX_PAYLOAD_BYTES,
    NatsSetupError,
    free_port,
    nats_server_binary,
)


@dataclass
class _Node:
    """One member of a ``NatsCluster``: its name, ports and store stay the same across
    restarts, as a machine's would."""

    name: str
    client_port: int
    cluster_port: int
    http_port: int  # monitoring: /healthz, /jsz
    dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.client_port}"

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    def write_config(self, cluster: str, route_ports: list[int]) -> None:
        """Routes to every node (its own included, which the server skips); a node alone
        gets no cluster block, so that it runs JetStream as a plain server does."""
        routes = ", ".join(f"nats-route://{HOST}:{port}" for port in route_ports)
        block = (
            f"cluster {{ name: {cluster}, listen: {HOST}:{self.cluster_port}, "
            f"routes: [{routes}] }}\n"
        )
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "server.conf").write_text(
            f"server_name: {self.name}\n"
            f"listen: {HOST}:{self.client_port}\n"
            f"http: {HOST}:{self.http_port}\n"
            f"max_payload: {MAX_PAYLOAD_BYTES}\n"
            f'jetstream {{ store_dir: "{self.dir / "store"}" }}\n'
            + (block if len(route_ports) > 1 else "")
        )

    def launch(self) -> None:
        with self.log_path.open("a") as log:
            log.write(f"\n--- launched at {time.strftime('%H:%M:%S')}\n")
        self.process = subprocess.Popen(
            [str(nats_server_binary()), "-c", str(self.dir / "server.conf"),
             "-l", str(self.log_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def end(self, sig: signal.Signals) -> None:
        """Send ``sig`` and wait for the process to exit (SIGKILL after 20 s)."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def monitor(self, path: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) of a monitoring endpoint; (0, {}) when it is down."""
        url = f"http://{HOST}:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            with contextlib.suppress(ValueError):
                return exc.code, json.loads(exc.read())
            return exc.code, {}
        except (OSError, ValueError):
            return 0, {}

    def tail(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- {self.name}\n{text[-2000:]}"


class NatsCluster:
    """``size`` clustered ``nats-server -js`` on loopback (each its own client, cluster
    and monitoring port, store and server name; routes between all of them), for
    replicated streams. ``kill(i)`` SIGKILLs one node, ``restart(i)`` starts it again
    on the same ports and store; ``rolling_restart()`` restarts each in turn, as an
    upgrade does. start()/stop() are idempotent; a context manager. ``NatsCluster(1)``
    is one plain server that keeps its port and store across a kill and restart.

    Healthy means every running node's ``/healthz`` answers 200 (it has a JetStream
    meta leader and each of its streams and consumers is current) and each stream it
    holds names a running leader."""

    def __init__(
        self, size: int = 3, *, name: str = "flotilla", start_timeout_s: float = 60.0
    ) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one node")
        self.size = size
        self.name = name
        self.start_timeout_s = start_timeout_s
        self.nodes: list[_Node] = []
        self._dir: Path | None = None
        self.start_s = 0.0  # seconds the last start() took, for reports

    @property
    def url_list(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def urls(self) -> str:
        """Comma-separated, every node, as flotilla's --nats setting is written."""
        if not self.nodes:
            raise RuntimeError("the nats cluster is not running")
        return ",".join(self.url_list)

    @property
    def down(self) -> list[int]:
        """The nodes killed and not restarted."""
        return [i for i, node in enumerate(self.nodes) if node.process is None]

    @property
    def pids(self) -> list[int]:
        return [node.process.pid for node in self.nodes if node.process is not None]

    def start(self) -> Self:
        if self.nodes:
            return self
        started = time.perf_counter()
        self._dir = Path(tempfile.mkdtemp(prefix="flotilla-nats-cluster-"))
        self.nodes = [
            _Node(f"n{i}", free_port(), free_port(), free_port(), self._dir / f"n{i}")
            for i in range(self.size)
        ]
        for node in self.nodes:
            node.write_config(self.name, [n.cluster_port for n in self.nodes])
        atexit.register(self.stop)
        for node in self.nodes:
            node.launch()
        self.wait_healthy()
        self.start_s = time.perf_counter() - started
        return self

    def kill(self, *indexes: int) -> None:
        """SIGKILL these nodes: no shutdown, each store as the crash left it."""
        for index in indexes:
            self.nodes[index].end(signal.SIGKILL)

    def restart(self, *indexes: int) -> float:
        """Start these nodes again on their ports and stores (stopping a running one
        first with SIGTERM, a clean shutdown); seconds until the cluster is healthy.
        Nodes that must form a quorum together (after a total outage) restart in one
        call."""
        started = time.monotonic()
        for index in indexes:
            self.nodes[index].end(signal.SIGTERM)
        for index in indexes:
            self.nodes[index].launch()
        self.wait_healthy()
        return time.monotonic() - started

    def rolling_restart(self) -> list[float]:
        """Restart every node in turn, each only once the cluster is healthy again;
        seconds each restart took."""
        return [self.restart(i) for i in range(self.size)]

    def leader(self, stream: str) -> int | None:
        """The index of the node leading ``stream``'s replicas, as a running node sees
        it; None when none does (an election under way) or the stream is unknown."""
        names = {node.name: i for i, node in enumerate(self.nodes)}
        for node in self.nodes:
            if node.process is None:
                continue
            _, jsz = node.monitor("/jsz?streams=true")
            for account in jsz.get("account_details", []):
                for detail in account.get("stream_detail", []):
                    if detail.get("name") == stream:
                        return names.get(detail.get("cluster", {}).get("leader"))
        return None

    async def move_leader(self, stream: str, index: int, tries: int = 5) -> None:
        """Make node ``index`` lead ``stream`` (the leader steps down in its favour), so
        that a fault can be aimed at the leader deterministically."""
        request = json.dumps({"placement": {"preferred": self.nodes[index].name}}).encode()
        nc = await nats.connect(self.url_list)
        try:
            for _ in range(tries):
                if await self._led_by(stream, index, within_s=0):
                    return
                with contextlib.suppress(nats.errors.Error):
                    await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", request)
                if await self._led_by(stream, index, within_s=5):
                    return
        finally:
            await nc.close()
        raise NatsSetupError(f"node {index} did not become {stream}'s leader")

    async def _led_by(self, stream: str, index: int, within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while await asyncio.to_thread(self.leader, stream) != index:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    def wait_healthy(self, timeout_s: float | None = None) -> None:
        """Until the running nodes are healthy (see the class); NatsSetupError with the
        logs when one exits or time runs out."""
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        while True:
            running = [node.process for node in self.nodes if node.process is not None]
            if any(process.poll() is not None for process in running):
                raise NatsSetupError("a nats-server exited:\n" + self._tails())
            if self._healthy():
                return
            if time.monotonic() > deadline:
                raise NatsSetupError("the nats cluster is not healthy:\n" + self._tails())
            time.sleep(0.1)

    def _healthy(self) -> bool:
        """/healthz says a node has a meta leader and its replicas are current; a stream
        whose leader just died can still pass it until an election, so each stream must
        also name a running leader."""
        running = {node.name for node in self.nodes if node.process is not None}
        for node in self.nodes:
            if node.process is None:
                continue
            if node.monitor("/healthz")[0] != 200:
                return False
            if self.size == 1:
                continue  # a plain server: its streams have no elected leader
            _, jsz = node.monitor("/jsz?streams=true")
            leaders = [
                detail.get("cluster", {}).get("leader")
                for account in jsz.get("account_details", [])
                for detail in account.get("stream_detail", [])
            ]
            if any(leader not in running for leader in leaders):
                return False
        return True

    def _tails(self) -> str:
        return "\n".join(node.tail() for node in self.nodes)

    def stop(self) -> None:
        nodes, self.nodes = self.nodes, []
        for node in nodes:
            if node.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    node.process.terminate()
        for node in nodes:
            node.end(signal.SIGTERM)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
