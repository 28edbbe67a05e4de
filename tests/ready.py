"""Waiting for a server the test started: until its /ready answers 200."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest


def wait_ready(url: str, alive: Callable[[], str | None], timeout_s: float = 120.0) -> None:
    """Poll ``url``/ready; ``alive`` returns None while the server runs, else what to
    show of its end (its log). Fails the test on a dead server or past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if (dead := alive()) is not None:
            pytest.fail(f"the server stopped while starting:\n{dead}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            pytest.fail(f"the server was not ready within {timeout_s:.0f} s")
        time.sleep(0.2)


@contextlib.contextmanager
def served_in_thread(app: Any, port: int, name: str) -> Iterator[str]:
    """``app`` under uvicorn on ``port`` in a thread of this process, ready; its URL."""
    import uvicorn

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", loop="asyncio", ws="none"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, lambda: None if thread.is_alive() else "(its thread ended)")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
