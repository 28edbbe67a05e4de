"""Waiting for a server the test started: until its /ready answers 200."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

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
