"""One Apache Kafka node in KRaft mode (broker and controller in one JVM) on loopback ports,
with its storage and logs in a temporary directory that stop() removes.

``python -m bench.services.kafka.broker`` starts one and prints its bootstrap address until
Ctrl-C, for benchmarks and manual runs."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from aiokafka.admin import AIOKafkaAdminClient

from bench.services.kafka.jars import KafkaSetupError, ensure_jars

HOST = "127.0.0.1"
# Answering FindCoordinator makes the broker create __consumer_offsets; doing that while
# starting spares the first consumer group a round of COORDINATOR_NOT_AVAILABLE retries.
WARMUP_GROUP = "flotilla-broker-warmup"
# The flags kafka-server-start.sh uses; the heap is small because one test node holds
# little, and fixed so the JVM does not spend start-up time growing it.
JVM_FLAGS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
"""


def _java() -> str:
    if home := os.environ.get("JAVA_HOME"):
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
    if found := shutil.which("java"):
        return found
    raise KafkaSetupError("Java 17+ (java on PATH or JAVA_HOME) is needed to run Kafka 4")


def _free_ports(count: int) -> list[int]:
    # All sockets stay bound until every port is chosen, so the ports differ; another
    # process may still grab one before the broker binds it, which start() reports.
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]


def _cluster_id() -> str:
    # Kafka's Uuid.randomUuid(): 16 random bytes, URL-safe base64 without padding, never
    # starting with "-" (the tools would read it as an option).
    while True:
        encoded = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not encoded.startswith("-"):
            return encoded


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} unreadable)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


async def _probe(bootstrap: str, timeout_s: float) -> None:
    """Raises unless the broker answers metadata naming itself and coordinates groups."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000)
    )
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        if not cluster["brokers"]:
            raise KafkaSetupError("metadata lists no brokers yet")
        await admin.find_coordinator(WARMUP_GROUP)
    finally:
        await admin.close()


def _probe_in_thread(bootstrap: str, timeout_s: float) -> None:
    # A thread of its own gives the probe a fresh event loop, so start() works whether or
    # not the caller is already inside one (a sync fixture under pytest-asyncio, a script).
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(_probe(bootstrap, timeout_s))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="kafka-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 5)
    if thread.is_alive():
        raise TimeoutError("the readiness probe hung")
    if errors:
        raise errors[0]


class KafkaBroker:
    """A single-node KRaft cluster. start() and stop() are idempotent; also a context manager.

    auto_create_topics is off by default, as in most production clusters: a test that
    forgets to create its topic fails instead of getting a one-partition topic by accident.
    extra_properties override or extend the generated server.properties. listeners adds
    named listeners beside PLAINTEXT (name -> security protocol, as SASL_SSL), each on a
    port of its own (``address(name)``), configured through extra_properties
    (``listener.name.<name>.*``); format_args go to the storage format (``--add-scram``).
    halt() and resume() make an outage: the process goes and comes back on the same ports
    and storage, as a restarted production broker does.
    """

    def __init__(
        self,
        *,
        heap_mb: int = 512,
        auto_create_topics: bool = False,
        extra_properties: Mapping[str, str] | None = None,
        listeners: Mapping[str, str] | None = None,
        format_args: Sequence[str] = (),
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 15.0,
    ) -> None:
        self.heap_mb = heap_mb
        self.auto_create_topics = auto_create_topics
        self.extra_properties = dict(extra_properties or {})
        self.listeners = dict(listeners or {})
        self.format_args = list(format_args)
        self._listener_ports: dict[str, int] = {}
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.cluster_id = ""
        self.start_s = 0.0  # seconds the last start() took, for reports
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._stdout: IO[bytes] | None = None
        self._port = 0
        self._command: list[str] = []

    @property
    def bootstrap(self) -> str:
        if not self.running:
            raise RuntimeError("the broker is not running (not started, stopped, or it exited)")
        return f"{HOST}:{self._port}"

    def address(self, listener: str) -> str:
        """host:port of one of the ``listeners`` given at construction."""
        if not self.running:
            raise RuntimeError("the broker is not running (not started, stopped, or it exited)")
        return f"{HOST}:{self._listener_ports[listener]}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> Path | None:
        """The broker's log4j log (INFO and up); gone after stop()."""
        return self._dir / "logs" / "server.log" if self._dir is not None else None

    def start(self) -> Self:
        if self._process is not None:
            return self
        started = time.perf_counter()
        libs = ensure_jars()
        java = _java()
        self._dir = Path(tempfile.mkdtemp(prefix="flotilla-kafka-"))
        try:
            self._launch(java, libs)
            self._wait_ready(time.monotonic() + self.start_timeout_s)
        except Exception as exc:
            report = self._failure_report(exc)
            self.stop()
            raise KafkaSetupError(report) from exc
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - started
        atexit.register(self.stop)
        return self

    def _properties(self, broker_port: int, controller_port: int) -> dict[str, str]:
        assert self._dir is not None
        controller = f"{HOST}:{controller_port}"
        ports = {"PLAINTEXT": broker_port, **self._listener_ports}
        listeners = ",".join(f"{name}://{HOST}:{port}" for name, port in ports.items())
        listeners += f",CONTROLLER://{controller}"
        protocols = {"CONTROLLER": "PLAINTEXT", "PLAINTEXT": "PLAINTEXT", **self.listeners}
        properties = {
            "process.roles": "broker,controller",
            "node.id": "1",
            # A dynamic quorum of one voter, formatted with --standalone.
            "controller.quorum.bootstrap.servers": controller,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listeners": listeners,
            "advertised.listeners": listeners,
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "log.dirs": str(self._dir / "data"),
            "num.partitions": "1",
            "auto.create.topics.enable": str(self.auto_create_topics).lower(),
            # One node: every internal topic has one replica. Fewer partitions than the
            # default 50 make creating them (on the first group, transaction) quick.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Tests start and stop consumers often; the default 3 s delay per first join
            # only helps big groups that start together.
            "group.initial.rebalance.delay.ms": "0",
        }
        properties.update(self.extra_properties)
        return properties

    def _launch(self, java: str, libs: Path) -> None:
        assert self._dir is not None
        logs = self._dir / "logs"
        logs.mkdir()
        self._port, controller_port, *extra = _free_ports(2 + len(self.listeners))
        self._listener_ports = dict(zip(self.listeners, extra, strict=True))
        config = self._dir / "server.properties"
        config.write_text(
            "".join(f"{k}={v}\n" for k, v in self._properties(self._port, controller_port).items())
        )
        log4j = self._dir / "log4j2.properties"
        log4j.write_text(LOG4J2.format(path=logs / "server.log"))
        classpath = str(libs / "*")
        self.cluster_id = _cluster_id()
        # kafka-storage.sh format: write meta.properties and the bootstrap checkpoint.
        # A short-lived tool: the quick JIT tier and serial GC save ~0.4 s of its ~1.5 s.
        format_command = [java, "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
        format_command += ["-cp", classpath, "kafka.tools.StorageTool"]
        format_command += ["format", "-t", self.cluster_id, "-c", str(config), "--standalone"]
        format_command += self.format_args
        formatted = subprocess.run(
            format_command,
            capture_output=True,
            text=True,
            timeout=self.start_timeout_s,
            check=False,
        )
        if formatted.returncode != 0:
            raise KafkaSetupError(
                f"formatting storage failed (exit {formatted.returncode}):\n"
                f"{formatted.stdout}{formatted.stderr}"
            )
        heap = f"{self.heap_mb}m"
        command = [java, f"-Xms{heap}", f"-Xmx{heap}", *JVM_FLAGS]
        command += [f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        self._command = [*command, "kafka.Kafka", str(config)]
        self._spawn()

    def _spawn(self) -> None:
        assert self._dir is not None
        self._stdout = (self._dir / "logs" / "stdout.log").open("ab")
        self._process = subprocess.Popen(
            self._command,
            stdin=subprocess.DEVNULL,
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C meant for pytest or the CLI reaches us, and stop()
            # then shuts the broker down in order.
            start_new_session=True,
        )

    def _wait_ready(self, deadline: float) -> None:
        assert self._process is not None
        last: Exception | None = None
        while True:
            if self._process.poll() is not None:
                raise KafkaSetupError(
                    f"the broker exited with status {self._process.returncode} while starting"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"the broker did not become ready within {self.start_timeout_s:.0f} s"
                    f" (last probe: {last!r})"
                )
            try:
                # A cheap connect first: until the listener is up, aiokafka only logs
                # connection errors.
                with socket.create_connection((HOST, self._port), timeout=1.0):
                    pass
                _probe_in_thread(f"{HOST}:{self._port}", min(5.0, max(remaining, 1.0)))
                return
            except Exception as exc:
                last = exc
                time.sleep(0.1)

    def _failure_report(self, error: Exception) -> str:
        lines = [f"Kafka broker failed to start: {error}"]
        if self._dir is not None:
            for name in ("stdout.log", "server.log"):
                path = self._dir / "logs" / name
                if path.exists():
                    lines.append(f"--- tail of {name} ---\n{_tail(path)}")
        return "\n".join(lines)

    def halt(self, *, kill: bool = False) -> None:
        """Stop the broker process, SIGTERM or (``kill``) SIGKILL, keeping its storage and
        its ports: an outage that ``resume`` ends with the same cluster at the same
        address, its topics, records and committed offsets intact."""
        if self._dir is None:
            raise RuntimeError("the broker was never started")
        self._end_process(kill=kill)

    def resume(self) -> Self:
        """Start the halted broker again on its storage and ports; returns once ready."""
        if self._dir is None:
            raise RuntimeError("the broker was never started")
        if self.running:
            return self
        self._spawn()
        try:
            self._wait_ready(time.monotonic() + self.start_timeout_s)
        except Exception as exc:
            raise KafkaSetupError(self._failure_report(exc)) from exc
        return self

    def _end_process(self, *, kill: bool = False) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            if kill:
                process.kill()
            else:
                process.terminate()
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._stdout is not None:
            self._stdout.close()
            self._stdout = None

    def stop(self) -> None:
        """SIGTERM (a clean shutdown takes about 2 s), SIGKILL after stop_timeout_s."""
        atexit.unregister(self.stop)
        self._end_process()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def wait(self) -> int:
        """Block until the broker process exits; its exit status."""
        if self._process is None:
            raise RuntimeError("the broker is not running")
        return self._process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.services.kafka.broker",
        description="Run a single-node Kafka (KRaft) broker on loopback until Ctrl-C.",
    )
    parser.add_argument("--heap-mb", type=int, default=1024, help="JVM heap (default 1024)")
    parser.add_argument(
        "--auto-create-topics", action="store_true", help="let producers create topics"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra server.properties entry (repeatable)",
    )
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.set)
    # SIGTERM (from a benchmark harness) stops the broker like Ctrl-C does; SIGINT is set
    # too because a shell starting us in the background (`... &`) leaves it ignored.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    broker = KafkaBroker(
        heap_mb=args.heap_mb, auto_create_topics=args.auto_create_topics, extra_properties=extra
    )
    try:
        broker.start()
        print(broker.bootstrap, flush=True)
        print(
            f"kafka up in {broker.start_s:.1f} s; log: {broker.log_path}; Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        status = broker.wait()
        print(f"the broker exited with status {status}; log tail:", file=sys.stderr)
        if broker.log_path is not None:
            print(_tail(broker.log_path), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
