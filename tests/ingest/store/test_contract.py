"""One contract for every VectorStore: qdrant-client (``:memory:``, the store server over
an edge shard, and a real server when QDRANT_URL is set) and qdrant-edge on disk; then what
only the embedded engine promises (reopening, surviving SIGKILL, one owner per shard) and
what only the client path does."""

from __future__ import annotations

import ast
import contextlib
import http.server
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from ingest.store import (
    STORES,
    AtLeast,
    CollectionModelMismatch,
    CollectionNotFound,
    CollectionSpec,
    Hit,
    InvalidStoreRequest,
    Point,
    ShardLocked,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    VectorStore,
    chunk_point_id,
    open_store,
    point_id,
)
from ingest.store.qdrant import QdrantStore

REPO = Path(__file__).resolve().parents[3]
MODEL = "all-MiniLM-L6-v2"
DIM = 8

# The contract also runs against a real server when QDRANT_URL (and QDRANT_API_KEY, if
# the server wants one) is set; none can be installed on the build machines.
BACKENDS = ["qdrant-memory", "edge", "qdrant-facade"] + (
    ["qdrant-server"] if os.environ.get("QDRANT_URL") else []
)


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> NDArray[np.float32]:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    out: NDArray[np.float32] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


@pytest.fixture
def coll() -> str:
    # Unique, so runs against a shared server never see each other's points.
    return f"docs-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=BACKENDS)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, coll: str
) -> AsyncIterator[VectorStore]:
    kind: str = request.param
    if kind == "qdrant-memory":
        s = open_store("qdrant", location=":memory:")
    elif kind == "edge":
        s = open_store("edge", data_dir=tmp_path / "vectors")
    elif kind == "qdrant-facade":  # tests.ingest.store.qdrant_facade, shared by the session
        s = open_store("qdrant", url=request.getfixturevalue("store_server_url"))
    else:
        s = open_store(
            "qdrant", url=os.environ["QDRANT_URL"], api_key=os.environ.get("QDRANT_API_KEY")
        )
    try:
        yield s
    finally:
        await s.close()
        if kind == "qdrant-server":
            from qdrant_client import AsyncQdrantClient

            client = AsyncQdrantClient(
                url=os.environ["QDRANT_URL"], api_key=os.environ.get("QDRANT_API_KEY")
            )
            for name in (coll, f"{coll}-other"):
                await client.delete_collection(name)
            await client.close()


# --- ids and the registry ---


def test_point_id_is_deterministic_and_scoped_to_the_collection() -> None:
    a = point_id("docs", "bgb/§ 1")
    assert a == point_id("docs", "bgb/§ 1")
    assert a != point_id("other", "bgb/§ 1")
    assert a != point_id("docs", "bgb/§ 2")
    assert uuid.UUID(a).version == 5
    # Pinned: a change of namespace would re-key every stored point.
    assert point_id("docs", "doc-1") == "0fb8a57f-80db-5f8f-9359-d7dd69e19e22"


def test_chunk_ids_are_deterministic_distinct_and_start_at_the_document_id() -> None:
    assert chunk_point_id("docs", "a", 0) == point_id("docs", "a")
    ids = {
        chunk_point_id(c, d, i) for c in ("docs", "other") for d in ("a", "a/1") for i in range(4)
    }
    assert len(ids) == 16
    # No document's own id is another document's passage id.
    assert chunk_point_id("docs", "a", 1) not in {point_id("docs", f"a{s}1") for s in "/#-_ "}
    assert chunk_point_id("docs", "a", 3) == chunk_point_id("docs", "a", 3)
    # Pinned, as point_id is: a change would orphan every stored passage.
    assert chunk_point_id("docs", "doc-1", 2) == "79af0b60-593e-5e10-bfa0-07fc8ddb17b5"


def test_point_keeps_ids_canonical_and_refuses_non_uuids() -> None:
    upper = str(uuid.uuid4()).upper()
    assert Point(id=upper, vector=[0.0]).id == upper.lower()
    with pytest.raises(InvalidStoreRequest):
        Point(id="doc-1", vector=[0.0])


def test_registry_and_lazy_engine_imports() -> None:
    assert set(STORES) == {"qdrant", "edge"}
    with pytest.raises(InvalidStoreRequest, match="unknown vector store"):
        open_store("milvus")
    code = (
        "import sys, ingest.store; "
        "assert not {'qdrant_client', 'qdrant_edge'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_the_package_modules_never_import_the_opener() -> None:
    # ingest.store imports the engines inside its openers; a module of the package that
    # imported ingest.store back would make the circle the package is split to avoid.
    modules = sorted((REPO / "ingest" / "store").glob("[!_]*.py"))
    assert {m.stem for m in modules} >= {"contract", "errors", "edge", "qdrant"}
    for module in modules:
        tree = ast.parse(module.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }
        assert "ingest.store" not in imported, module.name


# --- the contract ---


async def test_creates_on_first_use_and_is_idempotent(store: VectorStore, coll: str) -> None:
    with pytest.raises(CollectionNotFound):
        await store.count(coll)
    spec = await store.ensure_collection(coll, DIM, "cosine", MODEL)
    assert (spec.name, spec.dimension, spec.distance, spec.model) == (coll, DIM, "cosine", MODEL)
    assert await store.ensure_collection(coll, DIM, "cosine", MODEL) == spec
    assert await store.count(coll) == 0


async def test_describe_reports_the_collection_or_raises_not_found(
    store: VectorStore, coll: str
) -> None:
    with pytest.raises(CollectionNotFound):
        await store.describe(coll)
    await store.ensure_collection(coll, 4, "cosine", "mini")
    assert await store.describe(coll) == CollectionSpec(coll, 4, "cosine", "mini")


async def test_upsert_by_deterministic_id_keeps_one_point_with_the_latest_payload(
    store: VectorStore, coll: str
) -> None:
    await store.ensure_collection(coll, DIM, "dot", MODEL)
    rng = np.random.default_rng(1)
    first, second = rng.standard_normal((2, DIM)).astype(np.float32)
    pid = point_id(coll, "doc-1")
    await store.upsert(coll, [Point(pid, first, {"text": "old", "rev": 1})])
    await store.upsert(coll, [Point(pid, second, {"text": "new", "rev": 2})])
    assert await store.count(coll) == 1
    [got] = await store.retrieve(coll, [pid])
    assert got.payload == {"text": "new", "rev": 2}
    np.testing.assert_allclose(got.vector, second, rtol=1e-6)


async def test_repeated_ids_in_one_batch_keep_the_last(store: VectorStore, coll: str) -> None:
    await store.ensure_collection(coll, DIM, "dot", MODEL)
    pid = point_id(coll, "doc-1")
    await store.upsert(
        coll, [Point(pid, [1.0] * DIM, {"rev": 1}), Point(pid, [2.0] * DIM, {"rev": 2})]
    )
    assert await store.count(coll) == 1
    [got] = await store.retrieve(coll, [pid])
    assert got.payload == {"rev": 2}
    assert got.vector == [2.0] * DIM


async def test_retrieve_returns_what_was_written_in_the_order_asked(
    store: VectorStore, coll: str
) -> None:
    await store.ensure_collection(coll, DIM, "dot", MODEL)
    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((5, DIM)).astype(np.float32) * 3
    payloads: list[dict[str, Any]] = [
        {"text": f"Grüße § {i}", "n": i, "x": i / 3, "tags": ["a", i], "nested": {"ok": True}}
        for i in range(5)
    ]
    ids = [point_id(coll, f"doc-{i}") for i in range(5)]
    # Vectors as numpy arrays and as lists both go in.
    await store.upsert(
        coll,
        [
            Point(ids[i], vectors[i] if i % 2 else vectors[i].tolist(), payloads[i])
            for i in range(5)
        ],
    )
    missing = point_id(coll, "never-written")
    got = await store.retrieve(coll, [ids[3], missing, ids[0], ids[4]])
    assert [p.id for p in got] == [ids[3], ids[0], ids[4]]
    for p, i in zip(got, (3, 0, 4), strict=True):
        assert isinstance(p.vector, list)
        assert np.array_equal(np.asarray(p.vector, dtype=np.float32), vectors[i])
        assert p.payload == payloads[i]
    assert await store.retrieve(coll, []) == []


async def test_cosine_collections_store_unit_vectors(store: VectorStore, coll: str) -> None:
    await store.ensure_collection(coll, DIM, "cosine", MODEL)
    pid = point_id(coll, "doc")
    await store.upsert(coll, [Point(pid, [3.0, 4.0] + [0.0] * (DIM - 2))])
    [got] = await store.retrieve(coll, [pid])
    np.testing.assert_allclose(got.vector, [0.6, 0.8] + [0.0] * (DIM - 2), rtol=1e-6)


async def test_delete_removes_only_those_ids(store: VectorStore, coll: str) -> None:
    await store.ensure_collection(coll, DIM, "cosine", MODEL)
    rng = np.random.default_rng(3)
    ids = [point_id(coll, f"doc-{i}") for i in range(5)]
    await store.upsert(coll, [Point(i, v) for i, v in zip(ids, unit(rng, 5), strict=True)])
    await store.delete(coll, [ids[1], ids[3], point_id(coll, "never-written")])
    assert await store.count(coll) == 3
    assert [p.id for p in await store.retrieve(coll, ids)] == [ids[0], ids[2], ids[4]]
    await store.delete(coll, [])
    assert await store.count(coll) == 3


async def test_search_returns_the_nearest_first_with_payload(store: VectorStore, coll: str) -> None:
    await store.ensure_collection(coll, DIM, "cosine", MODEL)
    rng = np.random.default_rng(4)
    vectors = unit(rng, 60)
    ids = [point_id(coll, f"doc-{i}") for i in range(60)]
    await store.upsert(coll, [Point(ids[i], vectors[i], {"doc": f"doc-{i}"}) for i in range(60)])
    for k in (0, 17, 59):
        query = vectors[k] + 0.01 * rng.standard_normal(DIM).astype(np.float32)
        hits = await store.search(coll, query, limit=5)
        assert len(hits) == 5
        assert isinstance(hits[0], Hit)
        assert hits[0].id == ids[k]
        assert hits[0].payload == {"doc": f"doc-{k}"}
        assert hits[0].score > 0.99
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        # Exactly the brute-force top 5.
        expected = np.argsort(-(vectors @ (query / np.linalg.norm(query))))[:5]
        assert [h.id for h in hits] == [ids[i] for i in expected]


async def test_euclid_scores_are_distances_nearest_first(store: VectorStore, coll: str) -> None:
    await store.ensure_collection(coll, 2, "euclid", MODEL)
    await store.upsert(
        coll,
        [
            Point(point_id(coll, "far"), [3.0, 4.0], {"name": "far"}),
            Point(point_id(coll, "near"), [0.0, 0.0], {"name": "near"}),
        ],
    )
    hits = await store.search(coll, [0.0, 0.1], limit=2)
    assert [h.payload["name"] for h in hits] == ["near", "far"]
    assert hits[0].score == pytest.approx(0.1, rel=1e-5)


async def test_filters_on_nested_keys_ints_bools_and_any_of(store: VectorStore, coll: str) -> None:
    await store.ensure_collection(coll, DIM, "cosine", MODEL)
    rng = np.random.default_rng(5)
    vectors = unit(rng, 40)
    langs = ["de", "en", "fr", "it"]
    ids = [point_id(coll, f"doc-{i}") for i in range(40)]
    await store.upsert(
        coll,
        [
            Point(
                ids[i],
                vectors[i],
                {
                    "metadata": {"lang": langs[i % 4], "tags": ["law", f"t{i % 3}"]},
                    "part": i % 5,
                    "current": i % 2 == 0,
                },
            )
            for i in range(40)
        ],
    )
    query = vectors[1]  # an "en" point: the filter must skip it to find the nearest "de"

    hits = await store.search(coll, query, limit=40, filter={"metadata.lang": "de"})
    assert len(hits) == 10
    assert {h.payload["metadata"]["lang"] for h in hits} == {"de"}
    de = [i for i in range(40) if i % 4 == 0]
    assert hits[0].id == ids[max(de, key=lambda i: float(vectors[i] @ query))]

    hits = await store.search(coll, query, limit=40, filter={"metadata.lang": ["de", "fr"]})
    assert {h.payload["metadata"]["lang"] for h in hits} == {"de", "fr"}
    assert len(hits) == 20

    hits = await store.search(coll, query, limit=40, filter={"part": 3, "current": False})
    assert sorted(hits_ids(hits)) == sorted(ids[i] for i in range(40) if i % 5 == 3 and i % 2)

    hits = await store.search(coll, query, limit=40, filter={"current": True})
    assert len(hits) == 20
    assert all(h.payload["current"] is True for h in hits)

    hits = await store.search(coll, query, limit=40, filter={"metadata.tags": "t2"})
    assert len(hits) == len([i for i in range(40) if i % 3 == 2])

    hits = await store.search(coll, query, limit=40, filter={"part": [1, 2]})
    assert len(hits) == 16

    assert await store.search(coll, query, filter={"metadata.lang": "xx"}) == []
    assert len(await store.search(coll, query, limit=3, filter={})) == 3


async def passages(store: VectorStore, coll: str, counts: dict[str, int]) -> list[str]:
    """Write ``counts[doc]`` passages of each document (payload doc_id, chunk_index)."""
    await store.ensure_collection(coll, DIM, "cosine", MODEL)
    rng = np.random.default_rng(6)
    points = [
        Point(chunk_point_id(coll, doc, i), v, {"doc_id": doc, "chunk_index": i})
        for doc, n in counts.items()
        for i, v in zip(range(n), unit(rng, n), strict=True)
    ]
    await store.upsert(coll, points)
    return [p.id for p in points]


async def left(store: VectorStore, coll: str, ids: list[str]) -> set[tuple[str, int]]:
    return {
        (p.payload["doc_id"], p.payload["chunk_index"]) for p in await store.retrieve(coll, ids)
    }


async def test_delete_matching_removes_exactly_what_matches(store: VectorStore, coll: str) -> None:
    ids = await passages(store, coll, {"a": 5, "b": 3, "c": 2, "d": 1})
    await store.delete_matching(coll, {"doc_id": "a", "chunk_index": AtLeast(2)})
    assert await left(store, coll, ids) == {
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2), ("c", 0), ("c", 1), ("d", 0)
    }  # fmt: skip
    await store.delete_matching(coll, {"doc_id": ["b", "c"], "chunk_index": AtLeast(1)})
    assert await left(store, coll, ids) == {("a", 0), ("a", 1), ("b", 0), ("c", 0), ("d", 0)}
    await store.delete_matching(coll, {"doc_id": ["a", "c", "never-written"]})
    assert await left(store, coll, ids) == {("b", 0), ("d", 0)}
    # Again, and matching nothing: no error, nothing else gone.
    await store.delete_matching(coll, {"doc_id": ["a", "c"]})
    await store.delete_matching(coll, {"chunk_index": AtLeast(99)})
    assert await store.count(coll) == 2


async def test_delete_matching_refuses_an_empty_filter_and_a_missing_collection(
    store: VectorStore, coll: str
) -> None:
    await passages(store, coll, {"a": 2})
    with pytest.raises(InvalidStoreRequest, match="non-empty filter"):
        await store.delete_matching(coll, {})
    with pytest.raises(InvalidStoreRequest):
        await store.delete_matching(coll, {"chunk_index": AtLeast(True)})  # type: ignore[arg-type]
    with pytest.raises(CollectionNotFound):
        await store.delete_matching(f"{coll}-other", {"doc_id": "a"})
    assert await store.count(coll) == 2


async def test_search_filters_on_a_lower_bound(store: VectorStore, coll: str) -> None:
    await passages(store, coll, {"a": 6, "b": 2})
    hits = await store.search(coll, [1.0] * DIM, limit=20, filter={"chunk_index": AtLeast(4)})
    assert sorted((h.payload["doc_id"], h.payload["chunk_index"]) for h in hits) == [
        ("a", 4),
        ("a", 5),
    ]


def hits_ids(hits: list[Hit]) -> list[str]:
    return [h.id for h in hits]


@pytest.mark.parametrize(
    "bad",
    [
        *({"score": 0.5}, {"a": {"b": 1}}, {"a": []}, {"a": ["x", 1]}, {"a": None}, {"": "x"}),
        *({"n": 2**63}, {"n": [1, -(2**63) - 1]}),  # beyond what the engines match: no crash
    ],
)
async def test_unmatchable_filters_are_refused(
    store: VectorStore, coll: str, bad: dict[str, Any]
) -> None:
    await store.ensure_collection(coll, DIM, "cosine", MODEL)
    with pytest.raises(InvalidStoreRequest):
        await store.search(coll, [1.0] * DIM, filter=bad)


async def test_another_model_is_refused(store: VectorStore, coll: str) -> None:
    await store.ensure_collection(coll, DIM, "cosine", MODEL)
    with pytest.raises(CollectionModelMismatch) as caught:
        await store.ensure_collection(coll, DIM, "cosine", "multilingual-e5-small")
    err = caught.value
    assert err.http_status == 409
    assert not err.retriable
    assert "re-embed into a new collection" in err.message
    assert MODEL in err.message
    assert "multilingual-e5-small" in err.message


async def test_another_dimension_or_distance_is_refused(store: VectorStore, coll: str) -> None:
    await store.ensure_collection(coll, DIM, "cosine", MODEL)
    with pytest.raises(CollectionModelMismatch, match="dimension"):
        await store.ensure_collection(coll, DIM * 2, "cosine", MODEL)
    with pytest.raises(CollectionModelMismatch, match="distance"):
        await store.ensure_collection(coll, DIM, "dot", MODEL)
    # The collection is unchanged and still usable.
    spec = await store.ensure_collection(coll, DIM, "cosine", MODEL)
    assert spec.dimension == DIM


async def test_bad_vectors_and_arguments_are_refused(store: VectorStore, coll: str) -> None:
    await store.ensure_collection(coll, DIM, "cosine", MODEL)
    pid = point_id(coll, "doc")
    for vector in ([1.0] * (DIM + 1), [float("nan")] * DIM, [[1.0] * DIM], ["x"] * DIM):
        with pytest.raises(InvalidStoreRequest):
            await store.upsert(coll, [Point(pid, vector)])
    with pytest.raises(InvalidStoreRequest):
        await store.search(coll, [1.0] * (DIM - 1))
    with pytest.raises(InvalidStoreRequest):
        await store.search(coll, [1.0] * DIM, limit=0)
    with pytest.raises(InvalidStoreRequest):
        await store.delete(coll, ["not-a-uuid"])
    with pytest.raises(InvalidStoreRequest):
        await store.ensure_collection("../escape", DIM, "cosine", MODEL)
    with pytest.raises(InvalidStoreRequest):
        await store.ensure_collection(f"{coll}-other", 0, "cosine", MODEL)
    with pytest.raises(InvalidStoreRequest):
        await store.ensure_collection(f"{coll}-other", DIM, "hamming", MODEL)  # type: ignore[arg-type]
    with pytest.raises(CollectionNotFound):
        await store.upsert(f"{coll}-other", [Point(pid, [1.0] * DIM)])
    assert await store.count(coll) == 0


async def test_a_closed_store_refuses_work(store: VectorStore, coll: str) -> None:
    await store.ensure_collection(coll, DIM, "cosine", MODEL)
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.count(coll)


# --- the embedded engine: persistence, SIGKILL, one owner per shard ---


async def test_edge_reopen_after_close_keeps_points_and_model(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    vectors = unit(rng, 20)
    ids = [point_id("docs", f"doc-{i}") for i in range(20)]
    async with open_store("edge", data_dir=tmp_path) as store:
        await store.ensure_collection("docs", DIM, "cosine", MODEL)
        await store.upsert("docs", [Point(ids[i], vectors[i], {"i": i}) for i in range(20)])
        await store.delete("docs", [ids[0]])

    async with open_store("edge", data_dir=tmp_path) as store:
        # Used without ensure_collection: opened from disk on first use.
        assert await store.count("docs") == 19
        [hit] = await store.search("docs", vectors[7], limit=1)
        assert (hit.id, hit.payload) == (ids[7], {"i": 7})
        [p] = await store.retrieve("docs", [ids[7]])
        np.testing.assert_allclose(p.vector, vectors[7], rtol=1e-6)
        with pytest.raises(CollectionModelMismatch):
            await store.ensure_collection("docs", DIM, "cosine", "another-model")

    sidecar = tmp_path / "docs" / "collection.json"
    assert MODEL in sidecar.read_text()


async def test_edge_one_store_owns_a_shard(tmp_path: Path) -> None:
    async with open_store("edge", data_dir=tmp_path) as first:
        await first.ensure_collection("docs", DIM, "cosine", MODEL)
        async with open_store("edge", data_dir=tmp_path, lock_wait_s=0.3) as second:
            started = time.monotonic()
            with pytest.raises(ShardLocked) as caught:
                await second.count("docs")
            assert 0.2 <= time.monotonic() - started < 2  # waited for a predecessor, briefly
            # Not retriable: the owner keeps it; the message says who and the ways in.
            assert not caught.value.retriable and caught.value.http_status == 409
            assert "another store in this process" in caught.value.message
            assert "--server" in caught.value.message and "--store qdrant" in caught.value.message
    async with open_store("edge", data_dir=tmp_path) as third:
        assert await third.count("docs") == 0


async def test_edge_shard_without_a_recorded_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "docs" / "shard").mkdir(parents=True)
    async with open_store("edge", data_dir=tmp_path) as store:
        with pytest.raises(CollectionModelMismatch, match=r"no collection\.json"):
            await store.ensure_collection("docs", DIM, "cosine", MODEL)


WRITER = """
import asyncio, sys
import numpy as np
from ingest.store import Point, open_store, point_id

async def main() -> None:
    store = open_store("edge", data_dir=sys.argv[1])
    await store.ensure_collection("docs", 8, "dot", "m")
    rng = np.random.default_rng(0)
    batch = 0
    while True:  # until killed
        points = [
            Point(point_id("docs", f"{batch}-{i}"), rng.standard_normal(8), {"b": batch, "i": i})
            for i in range(50)
        ]
        await store.upsert("docs", points)
        print(batch, flush=True)  # acknowledged
        batch += 1

asyncio.run(main())
"""


@pytest.fixture
def killed_writer(tmp_path: Path) -> Iterator[tuple[Path, list[int]]]:
    """A process that upserts 50-point batches, printing each acknowledged batch, until it
    is killed with SIGKILL mid-stream; yields the data dir and the acknowledged batches."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        acked: list[int] = []
        for line in proc.stdout:
            acked.append(int(line))
            if len(acked) == 20:
                os.kill(proc.pid, signal.SIGKILL)
                break
        # Lines already in the pipe were printed after their upsert returned: acknowledged.
        acked.extend(int(line) for line in proc.stdout)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
        assert len(acked) >= 20
        yield tmp_path, acked
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


async def test_edge_keeps_every_acknowledged_point_after_sigkill(
    killed_writer: tuple[Path, list[int]],
) -> None:
    data_dir, acked = killed_writer
    async with open_store("edge", data_dir=data_dir) as store:
        await store.ensure_collection("docs", 8, "dot", "m")
        assert await store.count("docs") >= 50 * len(acked)
        ids = [point_id("docs", f"{b}-{i}") for b in acked for i in range(50)]
        got = await store.retrieve("docs", ids)
        assert len(got) == len(ids)
        assert [(p.payload["b"], p.payload["i"]) for p in got] == [
            (b, i) for b in acked for i in range(50)
        ]


# --- the qdrant-client path ---


async def test_qdrant_unreachable_server_is_retriable(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    store = open_store(
        "qdrant", url=f"http://127.0.0.1:{port}", timeout_s=2, check_compatibility=False
    )
    # A server that is down at start is no misconfiguration: the start says so and goes on.
    # At the store logger's own level: an earlier test's basicConfig may have raised the
    # root's, which it would inherit.
    with caplog.at_level(logging.WARNING, logger="ingest.store.qdrant"):
        async with store:
            assert f"127.0.0.1:{port} does not answer yet (Qdrant unreachable" in caplog.text
            with pytest.raises(StoreUnavailable) as caught:
                await store.ensure_collection("docs", DIM, "cosine", MODEL)
            assert caught.value.retriable
            assert caught.value.http_status == 503
            with pytest.raises(StoreUnavailable):
                await store.count("docs")


@contextlib.contextmanager
def misbehaving_server(hang_up: bool) -> Iterator[int]:
    """A port whose connections are taken but never answered: left waiting (the kernel
    accepts them into the backlog), or, with ``hang_up``, closed at once."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.settimeout(0.1)
        done = threading.Event()

        def hang_up_each() -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    listener.accept()[0].close()

        closer = threading.Thread(target=hang_up_each, daemon=True)
        if hang_up:
            closer.start()
        try:
            yield listener.getsockname()[1]
        finally:
            done.set()
            if hang_up:
                closer.join()


@pytest.mark.parametrize("hang_up", [False, True], ids=["timeout", "hang-up"])
async def test_qdrant_server_that_times_out_or_hangs_up_is_retriable(hang_up: bool) -> None:
    """A write the server never answers is a StoreUnavailable (the pipeline retries it),
    never a refusal of the points (which it would dead-letter)."""
    with misbehaving_server(hang_up) as port:
        store = open_store("qdrant", url=f"http://127.0.0.1:{port}", timeout_s=1)
        try:
            with pytest.raises(StoreUnavailable, match="unreachable") as caught:
                await store.upsert("docs", [Point(point_id("docs", "a"), [1.0] * DIM, {})])
            assert caught.value.retriable
        finally:
            await store.close()


@contextlib.contextmanager
def refusing_server(status: int) -> Iterator[int]:
    """An HTTP server answering every request with ``status``, as Qdrant answers a wrong
    or revoked API key."""

    class Refuse(http.server.BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            body = b'{"status": {"error": "Invalid api-key"}}'
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_DELETE = _refuse

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection")
@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_api_key_is_a_misconfiguration_never_the_points_fault(
    status: int,
) -> None:
    """At start, and if the key is revoked mid-run: never a refusal of the points (which
    the pipeline would dead-letter) nor an outage to wait out silently."""
    with refusing_server(status) as port:
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(StoreMisconfigured, match=r"--qdrant-api-key") as caught:
            async with open_store("qdrant", url=url, api_key="wrong", timeout_s=2):
                pass
        assert not caught.value.retriable
        assert "wrong" not in caught.value.message
        store = QdrantStore(url=url, api_key="wrong", timeout_s=2)  # not started: mid-run
        try:
            with pytest.raises(StoreMisconfigured, match=rf"API key \({status}\)"):
                await store.upsert("docs", [Point(point_id("docs", "a"), [1.0] * DIM, {})])
        finally:
            await store.close()


async def test_qdrant_local_files_keep_the_model_and_refuse_foreign_collections(
    tmp_path: Path,
) -> None:
    from qdrant_client import AsyncQdrantClient, models

    async with open_store("qdrant", path=str(tmp_path)) as store:
        await store.ensure_collection("docs", DIM, "cosine", MODEL)
        await store.upsert("docs", [Point(point_id("docs", "a"), [1.0] * DIM, {"k": "v"})])
    # A collection made by someone else records no model: refused, not adopted.
    raw = AsyncQdrantClient(path=str(tmp_path))
    await raw.create_collection(
        "foreign", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE)
    )
    await raw.close()

    async with open_store("qdrant", path=str(tmp_path)) as store:
        assert await store.count("docs") == 1
        with pytest.raises(CollectionModelMismatch):
            await store.ensure_collection("docs", DIM, "cosine", "another-model")
        with pytest.raises(CollectionModelMismatch, match="none recorded"):
            await store.ensure_collection("foreign", DIM, "cosine", MODEL)
