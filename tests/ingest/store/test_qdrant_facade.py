"""The store server (the Qdrant facade): the contract runs through it in test_contract.py
("qdrant-facade"); here, what it refuses, several processes writing into one collection,
and a SIGKILL."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from qdrant_client.common.version_check import is_compatible

from ingest.store import InvalidStoreRequest, point_id
from ingest.store import qdrant as store_qdrant
from ingest.store.qdrant import QdrantStore
from tests.ingest.store.qdrant_facade import (
    MODEL_KEY,
    QDRANT_API_VERSION,
    Filter,
    create_app,
    payload_filter,
)
from tests.ingest.store.server_fixture import (
    REPO,
    free_port,
    start_store_server,
    stop,
    wait_ready,
)

CREATE = {"vectors": {"size": 4, "distance": "Dot"}, "metadata": {MODEL_KEY: "m"}}
ID = point_id("docs", "a")


def test_speaks_the_pinned_clients_version_and_model_key() -> None:
    assert is_compatible(importlib.metadata.version("qdrant-client"), QDRANT_API_VERSION)
    assert store_qdrant.MODEL_KEY == MODEL_KEY
    code = "import sys, tests.ingest.store.qdrant_facade; assert 'qdrant_client' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(tmp_path)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s") as client,
    ):
        yield client


async def test_answers_in_qdrants_envelope(http: httpx.AsyncClient) -> None:
    missing = await http.get("/collections/docs")
    assert missing.status_code == 404
    assert "not found" in missing.json()["status"]["error"]
    assert (await http.get("/collections/docs/exists")).json()["result"] == {"exists": False}
    created = await http.put("/collections/docs", json=CREATE)
    assert created.json()["result"] is True
    assert created.json()["status"] == "ok"
    again = await http.put("/collections/docs", json=CREATE)
    assert again.status_code == 409
    assert "already exists" in again.json()["status"]["error"]
    # The points form of an upsert, as well as the batch form QdrantStore sends.
    body = {"points": [{"id": ID, "vector": [1, 2, 3, 4], "payload": {"k": "v"}}]}
    assert (await http.put("/collections/docs/points?wait=true", json=body)).status_code == 200
    got = await http.post("/collections/docs/points", json={"ids": [ID]})
    assert got.json()["result"] == [{"id": ID, "payload": {"k": "v"}, "vector": None}]
    found = await http.post("/collections/docs/points/query", json={"query": [1, 0, 0, 0]})
    assert found.json()["result"]["points"] == [
        {"id": ID, "version": 0, "score": 1.0, "payload": None}
    ]
    info = (await http.get("/collections/docs")).json()["result"]
    assert info["points_count"] == 1
    assert info["config"]["metadata"] == {MODEL_KEY: "m"}
    assert info["config"]["params"]["vectors"] == {"size": 4, "distance": "Dot"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("", {**CREATE, "metadata": {}}),  # no model: the guard would have nothing to check
        ("", {**CREATE, "metadata": {MODEL_KEY: "m", "owner": "x"}}),
        ("", {**CREATE, "vectors": {"size": 4, "distance": "Hamming"}}),
        ("", {**CREATE, "hnsw_config": {"m": 0}}),
        ("", {**CREATE, "vectors": {"text": {"size": 4, "distance": "Dot"}}}),
        ("/points", {"batch": {"ids": [ID], "vectors": [[1, 2, 3, 4], [1, 2, 3, 4]]}}),
        ("/points", {"batch": {"ids": [ID], "vectors": [[1, 2, 3]]}}),
        ("/points", {"points": [{"id": 1, "vector": [1, 2, 3, 4]}]}),
        ("/points", {}),
        ("/points/delete", {"filter": {"must": []}}),
        ("/points/query", {"query": [1, 2, 3, 4], "with_vector": True}),
        ("/points/query", {"query": [1, 2, 3, 4], "score_threshold": 0.5}),
        ("/points/query", {"query": [1, 2, 3, 4], "filter": {"should": []}}),
        ("/points/query", {"query": {"recommend": {"positive": [ID]}}}),
        ("/points/count", {"filter": {"must": []}}),
    ],
)
async def test_refuses_what_it_does_not_do_with_422(
    http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    if path:
        await http.put("/collections/docs", json=CREATE)
    method = "PUT" if path in ("", "/points") else "POST"
    answer = await http.request(method, f"/collections/docs{path}", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["status"]["error"]


def test_filters_translate_to_the_flat_form() -> None:
    must = [
        {"key": "a.b", "match": {"value": True}},
        {"key": "n", "match": {"value": 3}},
        {"key": "lang", "match": {"any": ["de", "en"]}},
    ]
    assert payload_filter(Filter.model_validate({"must": must})) == {
        "a.b": True,
        "n": 3,
        "lang": ["de", "en"],
    }
    assert payload_filter(None) == {}
    with pytest.raises(InvalidStoreRequest, match="repeats"):
        payload_filter(Filter.model_validate({"must": [must[0], must[0]]}))


# --- several processes, one collection; a SIGKILL of the server ---

WRITER = """
import asyncio, sys
from ingest.store import Point, StoreUnavailable, point_id
from ingest.store.qdrant import QdrantStore

async def main() -> None:
    url, coll, name = sys.argv[1:4]
    async with QdrantStore(url=url, timeout_s=10) as store:
        await store.ensure_collection(coll, 8, "dot", "m")
        print("ready", flush=True)
        for batch, _ in enumerate(sys.stdin):  # one line per batch: the test sets the pace
            points = [
                Point(point_id(coll, f"{name}-{batch}-{i}"), [batch, i, 1, 0, 0, 0, 0, 0],
                      {"w": name, "b": batch, "i": i})
                for i in range(50)
            ]
            # Every writer also writes the same shared point per batch.
            points.append(Point(point_id(coll, f"shared-{batch}"), [batch] * 8, {"b": batch}))
            while True:
                try:
                    await store.upsert(coll, points)
                    break
                except StoreUnavailable:
                    print("retry", flush=True)
                    await asyncio.sleep(0.05)
            print(batch, flush=True)  # acknowledged

asyncio.run(main())
"""


class Writer:
    """A writer process: ``allow(n)`` lets it write n more batches of 50 + 1 shared points."""

    def __init__(self, url: str, coll: str, name: str, log: Path) -> None:
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", WRITER, url, coll, name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
        self.log = log
        self.acked: list[int] = []
        self.retries = 0

    def line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line, f"writer ended: {self.log.read_text()}"
        if line == "retry":
            self.retries += 1
        elif line != "ready":
            self.acked.append(int(line))
        return line

    def allow(self, batches: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n" * batches)
        self.proc.stdin.flush()

    def finish(self) -> int:
        """Wait for the exit, counting acknowledgements still in the pipe; the exit status."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()  # no more batches: the writer exits
        self.acked.extend(int(x) for x in self.proc.stdout if x.strip() not in ("retry", ""))
        return self.proc.wait(timeout=60)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()


@pytest.fixture
def writers() -> Iterator[list[Writer]]:
    started: list[Writer] = []

    def kill_all() -> None:
        for w in started:
            w.proc.kill()

    watchdog = threading.Timer(120, kill_all)
    watchdog.start()
    try:
        yield started
    finally:
        watchdog.cancel()
        for w in started:
            w.close()


def own_ids(coll: str, name: str, batches: list[int]) -> list[str]:
    return [point_id(coll, f"{name}-{b}-{i}") for b in batches for i in range(50)]


async def test_two_processes_write_one_collection(
    store_server_url: str, tmp_path: Path, writers: list[Writer]
) -> None:
    batches, url, coll = 60, store_server_url, f"docs-{uuid.uuid4().hex[:8]}"
    writers += [Writer(url, coll, n, tmp_path / f"{n}.err") for n in ("a", "b")]
    for w in writers:
        assert w.line() == "ready"  # both created or found the collection
    for batch in range(batches):  # in rounds, so the two upserts of a round are in flight together
        for w in writers:
            w.allow(1)
        for w in writers:
            assert w.line() == str(batch)
    for w in writers:
        assert w.finish() == 0, w.log.read_text()
        assert (w.acked, w.retries) == (list(range(batches)), 0)
    async with QdrantStore(url=url) as store:
        assert await store.count(coll) == 2 * 50 * batches + batches
        for name in ("a", "b"):
            got = await store.retrieve(coll, own_ids(coll, name, list(range(batches))))
            assert [(p.payload["w"], p.payload["b"], p.payload["i"]) for p in got] == [
                (name, b, i) for b in range(batches) for i in range(50)
            ]


async def test_acknowledged_points_survive_sigkill_of_the_server(
    tmp_path: Path, writers: list[Writer]
) -> None:
    data_dir, log, port = tmp_path / "vectors", tmp_path / "server.log", free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_store_server(data_dir, port, log)
    try:
        wait_ready(url, server, log)
        writer = Writer(url, "docs", "w", tmp_path / "writer.err")
        writers.append(writer)
        assert writer.line() == "ready"
        writer.allow(10_000)  # free-running
        while len(writer.acked) < 20:
            writer.line()
        os.kill(server.pid, signal.SIGKILL)
        assert server.wait(timeout=30) == -signal.SIGKILL
        while writer.line() != "retry":  # acks already on their way still count
            pass
        before = len(writer.acked)

        server = start_store_server(data_dir, port, log)  # same data, same address
        wait_ready(url, server, log)
        while len(writer.acked) < before + 10:  # the writer's retries get through
            writer.line()
        writer.proc.kill()
        assert writer.finish() == -signal.SIGKILL

        acked = writer.acked
        assert acked == list(range(len(acked)))  # each batch acknowledged once, in order
        async with QdrantStore(url=url) as store:
            count = await store.count("docs")
            assert 51 * len(acked) <= count <= 51 * (len(acked) + 1)  # + one in flight
            got = await store.retrieve("docs", own_ids("docs", "w", acked))
            assert [(p.payload["b"], p.payload["i"]) for p in got] == [
                (b, i) for b in acked for i in range(50)
            ]
    finally:
        stop(server)
