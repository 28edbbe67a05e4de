"""compose.yaml, run without Docker: each flotilla service's command, environment and
mounts run as a local process against real servers standing in for compose's own (a
nats-server with JetStream, the suite's Kafka broker, a Qdrant-speaking store), then an
embedding request goes through the gateway and a document through Kafka into the store.

What a container would see is rebuilt, not assumed: each service gets a root folder in
which its bind mounts are copies of their sources (a relative path inside a mounted file
resolves where the container would resolve it) and its named volumes are folders shared
by the services that mount them; container paths in its command and environment point
into that root. Host names of compose services become the stand-ins' addresses, and the
ports a container has to itself (its HTTP port, the worker's metrics port) become free
ones. Nothing else is translated: a flag or variable that does not exist, or a path that
does not resolve, fails here as it would in the container.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import typer
import yaml
from aiokafka.errors import TopicAlreadyExistsError
from qdrant_client import QdrantClient
from typer.core import TyperGroup

from bench.services.kafka.broker import KafkaBroker
from bench.services.nats import NatsServer
from flotilla.cli import app
from flotilla.distributed import DRAIN_S
from flotilla.settings import Settings, setting_fields
from ingest.store import chunk_point_id
from tests.distributed.cluster import free_port
from tests.ingest.kafka_helpers import create_topic, produce

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose.yaml"
READY_S = 600.0  # a worker loads the whole bundled fleet on two shared cores
FLOTILLA_IMAGE = "flotilla:latest"
README_REQUEST = {
    "model": "all-minilm-l6-v2",
    "input": ["flotilla serves fleets", "of small models"],
}
ADAPTER_REQUEST = {
    "model": "multilingual-e5-small:gesetze",
    "input": ["Kündigungsfrist"],
    "input_type": "query",
}


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return data


def flotilla_services() -> dict[str, dict[str, Any]]:
    """The services that run the image built from this repository."""
    return {
        name: spec
        for name, spec in compose()["services"].items()
        if spec.get("image") == FLOTILLA_IMAGE or spec.get("build") is not None
    }


# -- the static checks: names that must exist ---------------------------------------


def test_every_flotilla_service_runs_a_real_command_with_real_flags() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    for name, spec in flotilla_services().items():
        command = spec["command"]
        assert command[0] == "flotilla", (name, command)
        assert command[1] in root.commands, (name, command[1])
        accepted = {opt for param in root.commands[command[1]].params for opt in param.opts}
        flags = [arg.partition("=")[0] for arg in command[2:] if arg.startswith("-")]
        assert set(flags) <= accepted, (name, sorted(set(flags) - accepted))


def test_every_flotilla_variable_is_a_setting() -> None:
    """Those set, and those the file offers commented out (``# FLOTILLA_API_KEYS: ...``)."""
    known = {f"FLOTILLA_{key.upper()}" for key in setting_fields(Settings)}
    offered = set(re.findall(r"#\s*(FLOTILLA_\w+):", COMPOSE.read_text(encoding="utf-8")))
    for name, spec in flotilla_services().items():
        named = {v for v in spec.get("environment", {}) if v.startswith("FLOTILLA_")}
        assert named <= known, (name, sorted(named - known))
    assert offered <= known, sorted(offered - known)


def test_a_worker_has_the_time_to_drain_before_it_is_killed() -> None:
    """compose's stop_grace_period covers the worker's drain after SIGTERM."""
    grace = flotilla_services()["worker"]["stop_grace_period"]
    assert _seconds(grace) > DRAIN_S, (grace, DRAIN_S)


def _seconds(duration: str) -> float:
    matched = re.fullmatch(r"(\d+)(s|m)", duration)
    assert matched, duration
    return int(matched.group(1)) * (60 if matched.group(2) == "m" else 1)


# -- the run ------------------------------------------------------------------------


@dataclass
class Container:
    """One service as a local process: its root folder stands in for the container's
    file system (``path`` maps a container path into it)."""

    name: str
    spec: dict[str, Any]
    root: Path
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local one
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def path(self, inside: str) -> str:
        return str(self.root / inside.lstrip("/"))

    def mount(self, volumes: Path) -> None:
        """Bind mounts copied in (so relative paths resolve as in the container), named
        volumes linked to one folder per volume."""
        for entry in self.spec.get("volumes", []):
            source, target = entry.split(":")[:2]
            where = Path(self.path(target))
            where.parent.mkdir(parents=True, exist_ok=True)
            if source.startswith((".", "/")):
                origin = (COMPOSE.parent / source).resolve()
                assert origin.exists(), f"{self.name}: mount source {source} does not exist"
                copy = shutil.copytree if origin.is_dir() else shutil.copy2
                copy(origin, where)
            else:
                shared = volumes / source
                shared.mkdir(parents=True, exist_ok=True)
                where.symlink_to(shared, target_is_directory=True)

    def translate(self, value: str, hosts: dict[str, str]) -> str:
        """A compose host name becomes its stand-in's address, a container port a local
        one, a container path one inside the root."""
        for service, address in hosts.items():
            value = re.sub(rf"(?<=//){service}:\d+|^{service}:\d+$", address, value)
        if value.isdigit() and int(value) in self.ports:
            return str(self.ports[int(value)])
        if value.startswith("/") and not value.startswith("//"):
            return self.path(value)
        return value

    def start(self, hosts: dict[str, str], logs: Path) -> None:
        command = [self.translate(arg, hosts) for arg in self.spec["command"]]
        env = {k: self.translate(str(v), hosts) for k, v in self.spec["environment"].items()}
        if "worker" in self.spec["command"]:  # its metrics port, to itself in a container
            env["FLOTILLA_WORKER_PORT"] = str(self.ports[9400])
        self.log = logs / f"{self.name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flotilla", *command[1:]],
                cwd=self.root,
                env={**_base_env(), **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def healthcheck(self) -> bool:
        """compose's own health check command, its port translated."""
        check = self.spec.get("healthcheck", {}).get("test")
        if not check:
            return True
        argv = check[1:] if check[0] == "CMD" else ["sh", "-c", check[1]]
        argv = [re.sub(r"127\.0\.0\.1:(\d+)", self._local, arg) for arg in argv]
        if argv[0] == "python":
            argv[0] = sys.executable
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
        return done.returncode == 0

    def _local(self, matched: re.Match[str]) -> str:
        return f"127.0.0.1:{self.ports.get(int(matched.group(1)), int(matched.group(1)))}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        text = self.log.read_text(errors="replace")[-3000:] if self.log else ""
        return f"--- {self.name}\n{text}"


def _base_env() -> dict[str, str]:
    """The process environment less any FLOTILLA_* of the caller's: a container starts
    with its image's environment and compose's, nothing of the host's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    for line in dockerfile.splitlines():
        if line.startswith("ENV "):
            for pair in shlex.split(line[4:]):
                key, _, value = pair.partition("=")
                if key.startswith("HF_"):  # the image's offline switches
                    env[key] = value
    return env


@pytest.fixture
def containers(tmp_path: Path) -> Iterator[dict[str, Container]]:
    started: dict[str, Container] = {}
    volumes = tmp_path / "volumes"
    for name, spec in flotilla_services().items():
        container = Container(name, spec, tmp_path / "roots" / name)
        container.root.mkdir(parents=True)
        container.mount(volumes)
        for published in spec.get("ports", []):
            container.ports[int(str(published).rsplit(":", 1)[-1])] = free_port()
        container.ports.setdefault(9400, free_port())
        started[name] = container
    try:
        yield started
    finally:
        for container in started.values():
            container.stop()


def test_compose_runs_as_processes(
    containers: dict[str, Container], kafka_broker: KafkaBroker, store_url: str, tmp_path: Path
) -> None:
    with NatsServer() as nats:  # compose's own: its streams are this project's alone
        hosts = {
            "nats": urlsplit(nats.url).netloc,
            "kafka": kafka_broker.bootstrap,
            "qdrant": urlsplit(store_url).netloc,
        }
        asyncio.run(_create_topic(kafka_broker.bootstrap))  # compose's kafka-init
        for container in containers.values():
            container.start(hosts, tmp_path)
        asyncio.run(_serve_and_ingest(containers, kafka_broker.bootstrap, store_url))


def _init_topic() -> tuple[str, int]:
    """The topic and partitions compose's ``kafka-init`` creates, from its command."""
    command = compose()["services"]["kafka-init"]["command"]
    flags = dict(itertools.pairwise(command))
    return flags["--topic"], int(flags["--partitions"])


def test_the_topic_ingest_reads_is_the_one_compose_creates() -> None:
    services = compose()["services"]
    topic, _ = _init_topic()
    assert services["ingest"]["environment"]["FLOTILLA_TOPIC"] == topic
    waits = services["ingest"]["depends_on"]["kafka-init"]["condition"]
    assert waits == "service_completed_successfully"


async def _create_topic(bootstrap: str) -> None:
    topic, partitions = _init_topic()
    with contextlib.suppress(TopicAlreadyExistsError):  # --if-not-exists
        await create_topic(bootstrap, topic, partitions)


async def _serve_and_ingest(
    containers: dict[str, Container], bootstrap: str, store_url: str
) -> None:
    gateway = containers["gateway"]
    await _until_healthy(containers.values())
    base = f"http://127.0.0.1:{gateway.ports[8080]}"
    async with httpx.AsyncClient(timeout=120) as client:
        for body in (README_REQUEST, ADAPTER_REQUEST):  # the bundled adapter: a path in the fleet
            reply = await client.post(f"{base}/v1/embeddings", json=body)
            assert reply.status_code == 200, f"{body}: {reply.text}\n{_tails(containers.values())}"
            assert len(reply.json()["data"]) == len(body["input"])
            assert len(reply.json()["data"][0]["embedding"]) == 384
    ingest = containers["ingest"].spec["environment"]
    document = {"id": "bgb-134", "text": "Ein Rechtsgeschäft, das gegen ein Gesetz verstößt."}
    await produce(
        bootstrap, ingest["FLOTILLA_TOPIC"], [(b"bgb-134", json.dumps(document).encode())]
    )
    store = QdrantClient(url=store_url)
    collection = ingest["FLOTILLA_COLLECTION"]
    point = chunk_point_id(collection, "bgb-134", 0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if store.collection_exists(collection):
            found = store.retrieve(collection, [point], with_payload=True)
            if found:
                assert found[0].payload is not None
                assert found[0].payload["text"] == document["text"], found[0].payload
                return
        _alive(containers.values())
        await asyncio.sleep(0.5)
    raise AssertionError("the document never reached the store:\n" + _tails(containers.values()))


async def _until_healthy(containers: Any) -> None:
    containers = list(containers)
    deadline = time.monotonic() + READY_S
    while not all([await asyncio.to_thread(c.healthcheck) for c in containers]):
        _alive(containers)
        if time.monotonic() > deadline:
            raise AssertionError(f"not healthy in {READY_S:.0f} s:\n" + _tails(containers))
        await asyncio.sleep(1.0)


def _alive(containers: Any) -> None:
    for c in containers:
        if c.proc is not None and c.proc.poll() is not None:
            raise AssertionError(f"{c.name} exited ({c.proc.returncode}):\n" + _tails(containers))


def _tails(containers: Any) -> str:
    return "\n".join(c.tail() for c in containers)
