"""The worker's own small HTTP port: ``/metrics`` for Prometheus, ``/health`` (the
process answers) and ``/ready`` (models loaded and pulling) for orchestrators; a worker
that ingests Kafka also reports ingest as `flotilla serve` does: in ``/ready`` (status
"degraded" while ingest is not running, without failing the probe) and in its own probe
``/ready/ingest`` (200 while it consumes, 503 otherwise).

A worker serves no API, so this is a few lines over asyncio rather than a web
framework, and it leaves the process's signal handling alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from embedder.core.lifecycle import Lifecycle
from ingest.health import IngestHealth

MAX_REQUEST_BYTES = 8192


class WorkerHttp(Lifecycle):
    def __init__(
        self,
        host: str,
        port: int,
        ready: Callable[[], bool],
        *,
        ingest: IngestHealth | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.ready = ready
        self.ingest = ingest
        self._server: asyncio.Server | None = None

    @property
    def bound_port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def _answer(self, path: str) -> tuple[int, str, bytes]:
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest()
        if path == "/health":
            return 200, "application/json", b'{"status": "ok"}'
        if path == "/ready":
            ok = self.ready()
            answer: dict[str, object] = {"status": "ready" if ok else "not_ready"}
            if self.ingest is not None:
                status = self.ingest.status()
                answer["ingest"] = status.describe()
                if ok and not status.up:
                    answer["status"] = "degraded"
            return (200 if ok else 503), "application/json", json.dumps(answer).encode()
        if path == "/ready/ingest" and self.ingest is not None:
            status = self.ingest.status()
            body = json.dumps(status.describe()).encode()
            return (200 if status.up else 503), "application/json", body
        routes = "/metrics, /health, /ready" + (", /ready/ingest" if self.ingest else "")
        return 404, "application/json", json.dumps({"error": f"try {routes}"}).encode()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ValueError):
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
            method, path, _ = head[:MAX_REQUEST_BYTES].split(b"\r\n", 1)[0].decode().split(" ", 2)
            status, media_type, body = (
                self._answer(path.split("?", 1)[0])
                if method in ("GET", "HEAD")
                else (405, "application/json", b'{"error": "GET only"}')
            )
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}.get(
                status, "Service Unavailable"
            )
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {media_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else body)
            )
            await writer.drain()
        writer.close()
