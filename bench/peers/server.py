"""A benchmark's server process: start it, wait until it answers, stop it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx


def wait_ready(
    process: subprocess.Popen[bytes], url: str, timeout_s: float, log_path: Path, name: str
) -> None:
    """Until ``url`` answers 200; fails with the log's path if the server exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}; its log: {log_path}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{name} was not ready within {timeout_s:.0f} s; its log: {log_path}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as a user would stop it; killed if it is still there after 20 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def running(
    command: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    ready_url: str,
    timeout_s: float,
    name: str,
) -> Iterator[subprocess.Popen[bytes]]:
    """The server of ``command``, its output in ``log_path``, once ``ready_url`` answers;
    stopped on the way out."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            list(command), stdout=log, stderr=subprocess.STDOUT, env=dict(env)
        )
        try:
            wait_ready(process, ready_url, timeout_s, log_path, name)
            yield process
        finally:
            stop(process)
