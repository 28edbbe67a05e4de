"""Start the store server (``python -m tests.ingest.store.qdrant_facade``) as a child
process and wait until it answers; ``store_url`` (a fixture, loaded for every test by the
root conftest) does both."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_store_server(
    data_dir: Path, port: int, log_path: Path, *, extra: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """The server process, its output appended to ``log_path``; call ``wait_ready`` next.
    ``extra``: more of its arguments (``--ssl-certfile`` ... to serve over TLS)."""
    with open(log_path, "ab") as log:
        args = ["--data-dir", str(data_dir), "--host", "127.0.0.1", "--port", str(port), *extra]
        return subprocess.Popen(
            [sys.executable, "-m", "tests.ingest.store.qdrant_facade", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )


def wait_ready(
    url: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    timeout_s: float = 30,
    *,
    verify: ssl.SSLContext | bool = True,
) -> None:
    """Until the server answers ``/healthz``; ``verify``: how an https ``url`` is checked."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"store server exited {proc.returncode}: {log_path.read_text()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/healthz", timeout=1, verify=verify).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"store server not ready in {timeout_s}s: {log_path.read_text()}")


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def running_store_server(data_dir: Path, port: int | None = None) -> Iterator[str]:
    """A store server on ``data_dir`` for the ``with`` block; yields its URL.

    Its output goes to ``<data_dir>.log`` beside the data directory.
    """
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = data_dir.with_name(f"{data_dir.name}.log")
    proc = start_store_server(data_dir, port, log_path)
    try:
        wait_ready(url, proc, log_path)
        yield url
    finally:
        stop(proc)


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    """A store server of the test's own, its data in the test's temporary folder."""
    port = free_port()
    log = tmp_path / "store.log"
    proc = start_store_server(tmp_path / "store", port, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log)
        yield url
    finally:
        stop(proc)
