"""One owner per embedded collection: a second process that opens a collection a running
process owns fails within 2 s (not after minutes of retries), and the error names the
owner and the ways in that work while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.store import ShardLocked, open_store
from ingest.store.edge import EdgeStore

REPO = Path(__file__).resolve().parents[3]
URL = "http://127.0.0.1:18080"

OWNER = """
import asyncio, sys
from ingest.store.edge import EdgeStore

async def main() -> None:
    async with EdgeStore(sys.argv[1], serving_url=sys.argv[2]) as store:
        await store.ensure_collection("docs", 4, "cosine", "m")
        print("owning", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process owning collection 'docs' under tmp_path until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path), URL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "owning\n"
        yield proc
    finally:
        proc.kill()
        proc.communicate(timeout=10)  # reaps it and closes its pipes


async def test_a_second_process_fails_fast_with_the_ways_in(
    owner: subprocess.Popen[str], tmp_path: Path
) -> None:
    async with EdgeStore(tmp_path) as second:
        started = time.monotonic()
        with pytest.raises(ShardLocked) as caught:
            await second.ensure_collection("docs", 4, "cosine", "m")
        assert time.monotonic() - started < 2
    message = caught.value.message
    assert f"process {owner.pid}" in message and f"serving {URL}" in message
    assert f"flotilla ingest --from FILE --server {URL} --collection docs" in message
    assert "flotilla serve --kafka" in message and "--store qdrant" in message
    assert not caught.value.retriable and caught.value.http_status == 409


async def test_the_collection_is_free_once_its_owner_is_gone(
    owner: subprocess.Popen[str], tmp_path: Path
) -> None:
    owner.kill()  # SIGKILL: the kernel releases the lock with the process
    owner.communicate(timeout=10)
    async with open_store("edge", data_dir=tmp_path) as store:
        assert await store.count("docs") == 0
        await store.ensure_collection("docs", 4, "cosine", "m")
