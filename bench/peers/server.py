"""A peer's server process: wait until it answers, stop it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
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
