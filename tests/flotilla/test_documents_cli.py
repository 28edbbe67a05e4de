"""Ingesting while a server runs: `flotilla serve` owns its embedded collections, a second
process that opens one gets the ways in at once, and `flotilla ingest --from FILE
--server URL` sends the file through the server's documents route, its progress in
plain lines and its totals right, overload waited out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from embedder.core.adapters import AdapterCatalog
from embedder.tasks.embed.codecs import RequestLimits
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from flotilla.settings import Settings
from flotilla.wiring import gateway_config, record_rules
from gateway.app import create_app
from ingest.embedding import QueueEmbedder
from ingest.pipeline import IngestCore
from ingest.store.edge import EdgeStore
from tests.fakes import fake_fleet
from tests.gateway.conftest import Loader, _free_port, hub_offline
from tests.gateway.test_api import sample
from tests.ready import wait_ready
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-documents")
    with hub_offline():
        return tiny_fleet_file(folder, build_tiny_embedder(folder))


@dataclass(frozen=True)
class Served:
    url: str
    data: Path
    proc: subprocess.Popen[bytes]


def flotilla(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flotilla", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
    )


@pytest.fixture(scope="module")
def served(fleet_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`flotilla serve` with the tiny model on the embedded store, ready."""
    folder = tmp_path_factory.mktemp("served")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = folder / "server.log"
    command = [sys.executable, "-m", "flotilla", "serve", "--fleet", str(fleet_file)]
    command += ["--device", "cpu", "--data-dir", str(folder / "data"), "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
    try:
        wait_ready(url, lambda: None if proc.poll() is None else log.read_text())
        yield Served(url, folder / "data", proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def write_docs(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as out:
        for i in range(n):
            out.write(json.dumps({"id": f"doc-{i}", "text": f"Text number {i} of the file"}) + "\n")
        out.write("this line is not a document\n")
        out.write(json.dumps({"id": "empty", "text": " "}) + "\n")


def search_ids(url: str, collection: str, query: str, limit: int = 1000) -> list[str]:
    found = httpx.post(
        f"{url}/v1/collections/{collection}/search",
        json={"query": query, "limit": limit},
        timeout=30,
    )
    assert found.status_code == 200, found.text
    return [hit["payload"]["doc_id"] for hit in found.json()["results"]]


def test_a_second_process_is_told_the_ways_in(served: Served, tmp_path: Path) -> None:
    """The server owns 'owned' once it wrote to it; a backfill into it fails at once,
    before loading a model (this fleet's model cannot load), naming the ways that work."""
    first = httpx.post(
        f"{served.url}/v1/collections/owned/documents",
        json={"documents": [{"id": "a", "text": "owned by the server"}]},
        timeout=30,
    )
    assert first.status_code == 200, first.text
    unloadable = tmp_path / "fleet.yaml"
    unloadable.write_text(f"models:\n  nothing:\n    source: {{path: {tmp_path / 'none'}}}\n")
    source = tmp_path / "docs.jsonl"
    write_docs(source, 3)
    started = time.monotonic()
    done = flotilla(
        "ingest", "--from", str(source), "--fleet", str(unloadable), "--device", "cpu",
        "--data-dir", str(served.data), "--collection", "owned",
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"owned by process {served.proc.pid}" in done.stderr, done.stderr
    assert f"--server {served.url} --collection owned" in done.stderr
    assert "flotilla serve --kafka" in done.stderr and "--store qdrant" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert took < 15, took  # interpreter start-up and imports, then at most 1 s of waiting


def test_ingest_a_file_through_the_server(served: Served, tmp_path: Path) -> None:
    source = tmp_path / "docs.jsonl"
    write_docs(source, 300)
    args = ["ingest", "--from", str(source), "--server", served.url, "--collection", "sent"]
    args += ["--ingest-max-records", "40", "--progress-interval-s", "0.05"]
    for _ in range(2):  # the second run writes the same points again
        done = flotilla(*args)
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert "\x1b" not in done.stdout  # plain lines, not a bar, without a terminal
        summary = lines[-1]
        assert summary.startswith(f"docs.jsonl -> {served.url} sent: 302 docs in "), summary
        assert summary.endswith(f": 300 stored, 0 deleted, 2 failed; reasons in {source}.dlq.jsonl")
        assert all(" docs in " in line and "/302 (" in line for line in lines[:-1]), lines
        dead_file = tmp_path / "docs.jsonl.dlq.jsonl"
        dead = [json.loads(line) for line in dead_file.read_text().splitlines()]
        assert [(d["line"], d["value"]) for d in dead] == [
            (300, "this line is not a document"),
            (301, json.dumps({"id": "empty", "text": " "})),
        ]
        assert "no document id" in dead[0]["reason"] and "empty" in dead[1]["reason"]
        found = search_ids(served.url, "sent", "Text number 7 of the file")
        assert found[0] == "doc-7"
        assert sorted(found) == sorted(f"doc-{i}" for i in range(300))


def test_the_server_refusing_a_request_ends_the_run(served: Served, tmp_path: Path) -> None:
    source = tmp_path / "docs.jsonl"
    write_docs(source, 3)
    done = flotilla("ingest", "--from", str(source), "--server", served.url, "--fleet", "x")
    assert done.returncode == 0, done.stderr  # --fleet is not read: no model loads here
    bad = source.with_name("other.jsonl")
    bad.write_text(json.dumps({"id": "a", "text": "t", "model": "nope"}) + "\n")
    done = flotilla("ingest", "--from", str(bad), "--server", served.url)
    assert done.returncode == 1
    assert "answered 404" in done.stderr and "model 'nope' is not served" in done.stderr
    assert "Traceback" not in done.stderr


# -- overload: a real HTTP server over fakes whose forward pass a test holds ------------


@dataclass
class Held:
    url: str
    store: EdgeStore
    gate: threading.Event


@contextlib.asynccontextmanager
async def held_server(tmp_path: Path, max_inflight_tokens: int) -> AsyncIterator[Held]:
    """A documents route behind uvicorn, in a thread; forward passes wait for ``gate``."""
    gate = threading.Event()
    settings = Settings(max_inflight_tokens=max_inflight_tokens)
    fleet = fake_fleet("mini", max_tokens=512)
    queue = InProcessQueue()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", loader=Loader(forward_gate=gate))
    store = EdgeStore(tmp_path / "data")
    core = IngestCore(
        QueueEmbedder(queue), store, record_rules(settings, fleet, AdapterCatalog(fleet))
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with host, store:
            yield

    app = create_app(
        gateway_config(settings), fleet, queue, host, lifespan=lifespan, store=store, ingest=core
    )
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive()
            await asyncio.sleep(0.05)
        yield Held(f"http://127.0.0.1:{port}", store, gate)
    finally:
        gate.set()
        server.should_exit = True
        await asyncio.to_thread(thread.join, 30)


async def test_overload_is_waited_out(tmp_path: Path) -> None:
    """The server admits one batch at a time; the client's second batch gets 429 while
    the first is held, waits out Retry-After, and is stored once the first is done."""
    source = tmp_path / "docs.jsonl"
    with source.open("w") as out:
        for i in range(8):
            out.write(json.dumps({"id": f"d{i}", "text": f"word {i} " * 40}) + "\n")
    async with held_server(tmp_path, max_inflight_tokens=500) as held:
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flotilla", "ingest", "--from", str(source),
            "--server", held.url, "--collection", "c", "--ingest-max-records", "4",
            "--max-inflight-tokens", "4000",  # what the client believes: batches of 4 fit
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        route = "/v1/collections/{name}/documents"
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(base_url=held.url) as http:
            while True:
                metrics = (await http.get("/metrics")).text
                if sample(
                    metrics, "flotilla_requests_total", model="mini", route=route, status="429"
                ):
                    break
                assert time.monotonic() < deadline, "no batch was refused with 429"
                await asyncio.sleep(0.05)
        held.gate.set()
        out, err = await asyncio.wait_for(client.communicate(), 60)
        assert client.returncode == 0, (out + err).decode()
        assert out.decode().splitlines()[-1].endswith(": 8 stored, 0 deleted, 0 failed")
        assert await held.store.count("c") == 8
