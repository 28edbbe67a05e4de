"""Child processes of a benchmark: each with its output in a log file, stopped politely
(SIGTERM, then SIGKILL after a grace period), none left behind when the run ends or fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import aiohttp

from bench.load import HOST


class Child:
    """``python -m <module> <args>``, stdout and stderr to ``log``."""

    def __init__(
        self,
        name: str,
        module: str,
        args: Sequence[str],
        log: Path,
        env: Mapping[str, str],
        port: int | None = None,
    ) -> None:
        self.name = name
        self.log = log
        self.port = port  # where it serves HTTP, if it does
        self.stopped = False  # on purpose, by stop()
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        if self.port is None:
            raise ValueError(f"{self.name} serves no HTTP")
        return f"http://{HOST}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, a crash on purpose: no drain, nothing it holds handed back."""
        self.stopped = True
        self.proc.kill()
        self.proc.wait()

    def stop(self, timeout_s: float = 20.0) -> int:
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -signal.SIGKILL
        return self.proc.returncode

    def tail(self, chars: int = 3000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} ({self.log})\n{text[-chars:]}"


class Children:
    """The processes of one run; leaving the block stops every one still running."""

    def __init__(self, logs: Path, env: Mapping[str, str]) -> None:
        self.logs = logs
        self.env = dict(env)
        self.started: list[Child] = []

    def start(
        self,
        name: str,
        module: str,
        args: Sequence[str],
        port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Child:
        """``env`` adds to the run's environment for this child alone (its device)."""
        child = Child(name, module, args, self.logs / f"{name}.log", {**self.env, **(env or {})},
                      port)  # fmt: skip
        self.started.append(child)
        return child

    def check(self) -> None:
        """Fail with the dead one's log when a child has exited."""
        for child in self.started:
            if not child.alive and not child.stopped:
                raise SystemExit(
                    f"{child.name} exited with {child.proc.returncode}\n{child.tail()}"
                )

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for child in reversed(self.started):
            if child.alive:
                child.proc.send_signal(signal.SIGTERM)
        for child in reversed(self.started):
            child.stop()


async def wait_until(
    check: Callable[[], Awaitable[bool]], children: Children, what: str, timeout_s: float
) -> float:
    """Poll ``check`` until it holds (seconds it took); fail when a child dies or after
    ``timeout_s``."""
    started = time.monotonic()
    while True:
        children.check()
        try:
            if await check():
                return time.monotonic() - started
        except (OSError, aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError):
            pass  # not answering yet
        if time.monotonic() - started > timeout_s:
            tails = "\n".join(c.tail() for c in children.started)
            raise SystemExit(f"{what}: not within {timeout_s:.0f} s\n{tails}")
        await asyncio.sleep(0.25)
