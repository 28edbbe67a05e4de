"""The HTTP server under the API: uvicorn, with a deadline on each request's headers.

uvicorn times out idle keep-alive connections, but not a request that stops halfway
through its headers (or a connection that never sends one): each would hold its socket
for as long as the client likes. ``HeaderDeadline`` arms a timer when a connection opens
and when a request's first byte arrives, disarms it when the headers are complete, and
drops the connection when it fires. The body has its own deadline in the gateway
(``--body-timeout-s``: a 408 in the route's error shape).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from flotilla.settings import Settings

log = logging.getLogger(__name__)


class HeaderDeadline(HttpToolsProtocol):
    """uvicorn's httptools protocol; a request's headers must be in within
    ``header_timeout_s`` of its first byte (or of the connection opening)."""

    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            log.debug("%s: no complete request headers within %g s; dropped",
                      self.client, self.header_timeout_s)  # fmt: skip
            self.transport.close()


def header_deadline(seconds: float) -> type[HeaderDeadline]:
    """The protocol class with its deadline (uvicorn builds one protocol per connection)."""
    return type("HeaderDeadline", (HeaderDeadline,), {"header_timeout_s": seconds})


def server_config(app: FastAPI, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's configuration for ``app``; ``overrides`` are uvicorn's own options."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "timeout_graceful_shutdown": 10,  # in-flight requests get 10 s to finish
        "http": header_deadline(settings.header_timeout_s),
    }
    return uvicorn.Config(app, **(options | overrides))
