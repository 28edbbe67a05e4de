"""`flotilla ingest --from FILE`: a backfill straight into the embedded store (JSON lines
and Parquet, poison lines to <file>.dlq.jsonl), and `--produce` onto a real topic."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.services.kafka.broker import KafkaBroker
from ingest.store import chunk_point_id, point_id
from ingest.store.edge import EdgeStore
from tests.gateway.conftest import hub_offline
from tests.ingest.kafka_helpers import create_topic, produce, read_all
from tests.kafka.fixtures import unique_name
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-cli")
    with hub_offline():
        return tiny_fleet_file(folder, build_tiny_embedder(folder))


def flotilla(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flotilla", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        check=False,
    )


def write_docs(path: Path, n: int) -> list[str]:
    ids = [f"doc-{i}" for i in range(n)]
    with path.open("w", encoding="utf-8") as out:
        for i, doc_id in enumerate(ids):
            out.write(json.dumps({"id": doc_id, "text": f"Text number {i}", "metadata": {"i": i}}))
            out.write("\n")
        out.write("this line is not a document\n")
        out.write(json.dumps({"id": "empty", "text": " "}) + "\n")
    return ids


async def test_backfill_jsonl_into_the_embedded_store(fleet_file: Path, tmp_path: Path) -> None:
    source = tmp_path / "docs.jsonl"
    ids = write_docs(source, 700)
    data = tmp_path / "data"
    done = flotilla(
        "ingest", "--from", str(source), "--fleet", str(fleet_file), "--device", "cpu",
        "--data-dir", str(data), "--collection", "backfill", "--ingest-max-records", "256",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # Without a terminal: plain lines, then the totals as the store confirmed them.
    assert "\x1b" not in done.stdout
    summary = done.stdout.splitlines()[-1]
    assert summary.startswith("docs.jsonl -> backfill: 702 docs in "), summary
    assert summary.endswith(f": 700 stored, 0 deleted, 2 failed; reasons in {source}.dlq.jsonl")
    dlq = (tmp_path / "docs.jsonl.dlq.jsonl").read_text().splitlines()
    dead = [json.loads(line) for line in dlq]
    assert [d["line"] for d in dead] == [700, 701]
    assert "no document id" in dead[0]["reason"] and "empty" in dead[1]["reason"]
    async with EdgeStore(data) as store:
        assert await store.count("backfill") == 700
        points = await store.retrieve("backfill", [point_id("backfill", d) for d in ids[:5]])
        assert [p.payload["metadata"]["i"] for p in points] == [0, 1, 2, 3, 4]


async def test_backfill_parquet(fleet_file: Path, tmp_path: Path) -> None:
    source = tmp_path / "docs.parquet"
    table = pa.table(
        {
            "id": [f"p{i}" for i in range(50)],
            "text": [f"parquet row {i}" for i in range(50)],
            "metadata": [{"row": i} for i in range(50)],
        }
    )
    pq.write_table(table, source)
    data = tmp_path / "data"
    done = flotilla(
        "ingest", "--from", str(source), "--fleet", str(fleet_file), "--device", "cpu",
        "--data-dir", str(data), "--collection", "pq",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    async with EdgeStore(data) as store:
        assert await store.count("pq") == 50
        (point,) = await store.retrieve("pq", [point_id("pq", "p7")])
        assert point.payload["text"] == "parquet row 7"
        assert point.payload["metadata"] == {"row": 7}


async def test_backfill_splits_long_documents_unless_told_not_to(
    fleet_file: Path, tmp_path: Path
) -> None:
    long = " ".join(f"Sentence {i} of the long document is about contract law." for i in range(30))
    source = tmp_path / "long.jsonl"
    lines = [{"id": "long", "text": long}, {"id": "short", "text": "a short one"}]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    data = tmp_path / "data"
    common = ["ingest", "--from", str(source), "--fleet", str(fleet_file), "--device", "cpu"]
    done = flotilla(*common, "--data-dir", str(data), "--collection", "split", "--model", "tiny")
    assert done.returncode == 0, done.stdout + done.stderr
    async with EdgeStore(data) as store:
        ids = [chunk_point_id("split", "long", i) for i in range(20)]
        passages = await store.retrieve("split", ids)
        assert len(passages) > 3  # 64-token windows
        assert [p.payload["chunk_index"] for p in passages] == list(range(len(passages)))
        assert " ".join(p.payload["text"] for p in passages) == long
        assert await store.count("split") == len(passages) + 1

    whole = flotilla(*common, "--data-dir", str(tmp_path / "d2"), "--no-chunking")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    [dead] = [json.loads(x) for x in (tmp_path / "long.jsonl.dlq.jsonl").read_text().splitlines()]
    assert dead["line"] == 0
    assert "over the 64-token window of model 'tiny'" in dead["reason"]
    assert "--chunking" in dead["reason"] and "--auto-truncate" in dead["reason"]

    unknown = flotilla(*common, "--data-dir", str(tmp_path / "d3"), "--model", "nope")
    assert unknown.returncode != 0
    assert "--model 'nope'" in unknown.stderr and "tiny" in unknown.stderr


async def test_produce_a_file_onto_the_topic(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    topic = unique_name("produce")
    await create_topic(kafka_broker.bootstrap, topic, 3)
    source = tmp_path / "docs.jsonl"
    write_docs(source, 120)
    done = flotilla(
        "ingest", "--from", str(source), "--produce",
        "--kafka", kafka_broker.bootstrap, "--topic", topic,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    records = await read_all(kafka_broker.bootstrap, topic, expected=122)
    assert len(records) == 122
    keyed = {r.key: r.value for r in records if r.key is not None}  # type: ignore[attr-defined]
    # Keyed by id (so a document keeps one partition); the line without an id goes unkeyed
    # and will be dead-lettered by the pipeline, which owns the contract.
    assert set(keyed) == {f"doc-{i}".encode() for i in range(120)} | {b"empty"}
    assert json.loads(keyed[b"doc-5"])["text"] == "Text number 5"


def ingest_process(
    bootstrap: str, topic: str, fleet_file: Path, data: Path, *more: str
) -> subprocess.Popen[bytes]:
    args = ["--kafka", bootstrap, "--topic", topic, "--fleet", str(fleet_file)]
    args += ["--data-dir", str(data), "--device", "cpu", *more]
    return subprocess.Popen(
        [sys.executable, "-m", "flotilla", "ingest", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


@pytest.mark.parametrize("after_s", [0.3, 2.0, 8.0])
async def test_sigterm_at_any_point_of_start_up_exits_cleanly(
    kafka_broker: KafkaBroker, fleet_file: Path, tmp_path: Path, after_s: float
) -> None:
    """While importing, while loading models, or once consuming: SIGTERM is a clean stop
    (status 0), never a death by the signal."""
    topic = unique_name("idle")
    await create_topic(kafka_broker.bootstrap, topic, 1)
    proc = ingest_process(kafka_broker.bootstrap, topic, fleet_file, tmp_path / "data")
    await asyncio.sleep(after_s)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output.decode(errors="replace")[-3000:]


def test_a_missing_topic_is_a_clear_error(
    kafka_broker: KafkaBroker, fleet_file: Path, tmp_path: Path
) -> None:
    proc = ingest_process(kafka_broker.bootstrap, "no-such-topic", fleet_file, tmp_path / "d")
    output, _ = proc.communicate(timeout=60)
    text = output.decode(errors="replace")
    assert proc.returncode == 1, text[-3000:]
    assert "topic 'no-such-topic' does not exist" in text, text[-3000:]
    assert "Traceback" not in text and "Unclosed" not in text, text[-3000:]


async def test_consuming_without_a_terminal_prints_plain_lines_and_the_totals(
    kafka_broker: KafkaBroker, fleet_file: Path, tmp_path: Path
) -> None:
    topic = unique_name("lines")
    await create_topic(kafka_broker.bootstrap, topic, 2)
    docs = [(f"doc-{i}".encode(), json.dumps({"text": f"record {i}"}).encode()) for i in range(40)]
    await produce(kafka_broker.bootstrap, topic, docs)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "flotilla", "ingest", "--kafka", kafka_broker.bootstrap,
        "--topic", topic, "--fleet", str(fleet_file), "--device", "cpu",
        "--data-dir", str(tmp_path / "data"), "--collection", "k", "--progress-interval-s", "0.3",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        while not lines or "; 40 stored, 0 deleted, 0 failed, lag 0" not in lines[-1]:
            line = await asyncio.wait_for(proc.stdout.readline(), 90)
            assert line, "\n".join(lines)
            lines.append(line.decode().rstrip("\n"))
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, "\n".join(lines) + rest.decode()
    progress = [line for line in lines if line.startswith(f"{topic} -> k: ")]
    assert progress and all(" records in " in line for line in progress), lines
    summary = rest.decode().splitlines()[-1]
    assert summary.startswith(f"{topic} -> k: 40 records in "), summary
    assert summary.endswith(": 40 stored, 0 deleted, 0 failed, lag 0"), summary


async def test_a_missing_dead_letter_topic_that_may_not_be_created_is_a_clear_error(
    kafka_broker: KafkaBroker, fleet_file: Path, tmp_path: Path
) -> None:
    topic = unique_name("nodlq")
    await create_topic(kafka_broker.bootstrap, topic, 1)
    proc = ingest_process(
        kafka_broker.bootstrap, topic, fleet_file, tmp_path / "d", "--no-dlq-create"
    )
    output, _ = proc.communicate(timeout=60)
    text = output.decode(errors="replace")
    assert proc.returncode == 1, text[-3000:]
    assert f"the dead-letter topic '{topic}.dlq' does not exist" in text, text[-3000:]
    assert "--dlq-create" in text and "kafka-topics.sh" in text, text[-3000:]
    assert "Traceback" not in text and "not found" not in text, text[-3000:]


async def test_backfill_survives_poison_lines_of_every_shape(
    fleet_file: Path, tmp_path: Path
) -> None:
    source = tmp_path / "mixed.jsonl"
    poison = [
        b'{"id": "deep", "text": "t", "metadata": {"a": ' + b"[" * 1000 + b"]" * 1000 + b"}}",
        b'{"id": "deeper", "text": "t", "metadata": ' + b'{"a": ' * 50_000 + b"}" * 50_001,
        b'{"id": "bytes", "text": "\xff\xfe"}',
        b'{"id": "type", "text": ["a", "list"]}',
        b'{"id": "where", "text": "t", "collection": "no/slash"}',
        b'{"text": "no id at all"}',
    ]
    with source.open("wb") as out:
        for i in range(50):
            out.write(json.dumps({"id": f"ok-{i}", "text": f"good line {i}"}).encode() + b"\n")
            if i < len(poison):
                out.write(poison[i] + b"\n")
    done = flotilla(
        "ingest", "--from", str(source), "--fleet", str(fleet_file), "--device", "cpu",
        "--data-dir", str(tmp_path / "data"), "--collection", "mixed",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.splitlines()[-1]
    assert summary.endswith(
        f": 50 stored, 0 deleted, {len(poison)} failed; reasons in {source}.dlq.jsonl"
    )
    dead = [
        json.loads(line) for line in (tmp_path / "mixed.jsonl.dlq.jsonl").read_text().splitlines()
    ]
    assert [d["line"] for d in dead] == [2 * i + 1 for i in range(len(poison))]
    reasons = [d["reason"] for d in dead]
    assert "nest" in reasons[0] and "nest" in reasons[1]
    assert "UTF-8" in reasons[2] and "Expected `str`" in reasons[3]
    assert "collection name" in reasons[4] and "no document id" in reasons[5]
    async with EdgeStore(tmp_path / "data") as store:
        assert await store.count("mixed") == 50
