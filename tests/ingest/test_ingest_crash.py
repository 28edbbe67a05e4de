"""Ingest workers as separate processes, killed with SIGKILL mid-stream and restarted:
the collection still ends with exactly the documents' passages, vectors correct, through
long documents split into passages, re-ingested shorter, and deleted.

The workers are real `flotilla ingest` processes sharing one store through the
store server (an embedded shard has one owner), consuming a 4-partition topic on
the real broker.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from embedder.tasks.fleet import load_fleet
from ingest.store import Point, chunk_point_id
from ingest.store.qdrant import QdrantStore
from tests.distributed.cluster import Process
from tests.gateway.conftest import hub_offline
from tests.ingest.kafka_helpers import committed_lag, create_topic, produce
from tests.ingest.test_kafka_ingest import COLLECTION, documents, expected_vectors
from tests.kafka.broker import KafkaBroker
from tests.kafka.fixtures import unique_name
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow

SHORT = 2_000  # documents of one passage
LONG = 500  # documents of several passages
MAX_PASSAGES = 8


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-crash")
    with hub_offline():
        return tiny_fleet_file(folder, build_tiny_embedder(folder))


async def wait_for(
    check: Callable[[], Awaitable[bool]],
    timeout_s: float,
    what: str,
    workers: list[Process],
    every_s: float = 0.5,
) -> None:
    """Poll ``check`` every ``every_s``; fail early if a worker dies on its own, with its log."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        for worker in workers:
            if worker.proc.poll() not in (None, -signal.SIGKILL):
                raise AssertionError(f"a worker exited: {worker.log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            logs = "\n---\n".join(w.log.read_text()[-2000:] for w in workers)
            raise AssertionError(f"timed out waiting for {what}:\n{logs}")
        await asyncio.sleep(every_s)


def long_text(i: int, sentences: int, version: str) -> str:
    """A document of ``sentences`` sentences, about 15 tokens each: over the tiny model's
    64-token window from five sentences on."""
    topics = ["contract law", "tax rules", "shipping", "weather", "football", "poetry"]
    return " ".join(
        f"Version {version} of document {i} says in part {j} that {topics[(i + j) % 6]} "
        f"matters for case {i * 31 + j}."
        for j in range(sentences)
    )


def stream() -> tuple[list[tuple[str, str]], list[tuple[str, str | None]]]:
    """Phase one: short documents (one passage) and long ones (three or more). Phase two:
    long documents re-ingested shorter, short ones longer, and tombstones of both."""
    short = documents(SHORT)
    long = [(f"long-{i}", long_text(i, 14, "one")) for i in range(LONG)]
    second: list[tuple[str, str | None]] = [
        (f"long-{i}", long_text(i, 5, "two"))
        for i in range(0, LONG, 2)  # shorter
    ]
    second += [(d, long_text(n, 9, "two")) for n, (d, _) in enumerate(short[:SHORT:10])]
    second += [(f"long-{i}", None) for i in range(1, LONG, 4)]  # tombstones
    second += [(d, None) for d, _ in short[5:SHORT:10]]
    return short + long, second


async def stored_passages(store: QdrantStore, doc_ids: Sequence[str]) -> dict[str, list[Point]]:
    """Every point of each document, by passage index (up to MAX_PASSAGES looked for)."""
    ids = [chunk_point_id(COLLECTION, d, i) for d in doc_ids for i in range(MAX_PASSAGES)]
    found: dict[str, list[Point]] = {d: [] for d in doc_ids}
    for start in range(0, len(ids), 2000):
        for point in await store.retrieve(COLLECTION, ids[start : start + 2000]):
            found[point.payload["doc_id"]].append(point)
    for points in found.values():
        points.sort(key=lambda p: p.payload["chunk_index"])
    return found


async def test_kill_9_mid_stream_loses_and_duplicates_nothing(
    kafka_broker: KafkaBroker, fleet_file: Path, store_url: str, tmp_path: Path
) -> None:
    """Two SIGKILLs, one while documents are first written, one while they are replaced
    by shorter versions and deleted; each document ends with exactly its last version's
    passages, and tombstoned ones with none."""
    bootstrap, topic, group = kafka_broker.bootstrap, unique_name("crash"), unique_name("g")
    await create_topic(bootstrap, topic, 4)
    first, second = stream()
    await produce(bootstrap, topic, [(d.encode(), t.encode()) for d, t in first])
    args = [
        "--kafka", bootstrap, "--topic", topic, "--group", group,
        "--store", "qdrant", "--qdrant-url", store_url, "--fleet", str(fleet_file),
        "--collection", COLLECTION, "--device", "cpu", "--threads", "1",
        "--ingest-max-records", "200",
    ]  # fmt: skip
    store = QdrantStore(url=store_url)
    workers = [Process("ingest", args, tmp_path / f"worker-{i}.log") for i in range(2)]

    async def some_written() -> bool:
        try:
            return await store.count(COLLECTION) >= (SHORT + 3 * LONG) // 4
        except Exception:  # the collection appears with the first write
            return False

    async def lag() -> int:
        return await committed_lag(bootstrap, topic, group, 4)

    async def drained() -> bool:
        return await lag() == 0

    await wait_for(some_written, 180, "a quarter of the passages", workers)
    workers[0].kill()  # SIGKILL: no drain, no commit
    assert await lag() > 0, "the stream ended before the kill; make it longer"
    workers.append(Process("ingest", args, tmp_path / "worker-restarted.log"))
    await wait_for(drained, 300, "the first phase to be committed", workers)

    before = await stored_passages(store, [d for d, t in second if t is not None])
    await produce(bootstrap, topic, [(d.encode(), t and t.encode()) for d, t in second])

    async def replacing() -> bool:
        return 0 < await lag() < len(second)

    # Killed the moment a poll sees the phase under way; asking the lag again after the
    # kill would race the surviving worker, which may finish the phase in under a second,
    # hence the close polling too.
    await wait_for(replacing, 120, "the second phase to start", workers, every_s=0.02)
    workers[1].kill()
    workers.append(Process("ingest", args, tmp_path / "worker-restarted-2.log"))
    await wait_for(drained, 300, "every record to be committed", workers)
    for worker in workers[2:]:
        assert worker.stop(timeout_s=60) == 0, worker.log.read_text()[-3000:]

    final: dict[str, str | None] = dict(first)
    final.update(second)
    found = await stored_passages(store, list(final))
    expected_points = 0
    for doc, text in final.items():
        points = found[doc]
        if text is None:
            assert points == [], doc
            continue
        count = len(points)
        assert [p.payload["chunk_index"] for p in points] == list(range(count)), doc
        assert {p.payload["chunk_count"] for p in points} == {count}, doc
        assert [p.payload["text"] for p in points] == [
            text[p.payload["char_start"] : p.payload["char_end"]] for p in points
        ]
        # The passages are the last version, whole: every word once, in order.
        assert " ".join(p.payload["text"] for p in points).split() == text.split(), doc
        expected_points += count
    assert await store.count(COLLECTION) == expected_points  # nothing stale anywhere
    # The scenario happened: long documents were split, and the shortened lost passages.
    assert min(len(found[f"long-{i}"]) for i in range(3, LONG, 4)) >= 3
    shortened = [d for d, t in second if t is not None and d.startswith("long-")]
    assert all(len(found[d]) < len(before[d]) for d in shortened)
    assert all(len(found[d]) > 1 for d, t in second if t is not None and d.startswith("doc-"))

    # Vectors of every fifth passage (embedding them all here would take longer than
    # the ingest did): each is the tiny model's own vector of its passage's text.
    points = [p for doc in final for p in found[doc]][::5]
    with hub_offline():
        want = expected_vectors(load_fleet(fleet_file), [p.payload["text"] for p in points])
    got = np.stack([np.asarray(p.vector) for p in points])
    cosine = (got * want).sum(axis=1)
    assert cosine.min() >= 0.9999, cosine.min()
    await store.close()
