"""Errors of the HTTP layer itself, in ``embedder.errors``' style (``http_status``,
``code``): the one handler in ``gateway.app`` answers them in each route's shape."""

from __future__ import annotations

from embedder.errors import FlotillaError


class ClientGone(FlotillaError):
    """The client closed the connection before its answer: nobody reads the response,
    so it is logged at debug and its job withdrawn."""

    http_status = 499
    code = "client_closed_request"


class BodyTimeout(FlotillaError):
    """The request body stopped arriving. The connection closes with the answer: the
    rest of the body may still come, and must not be read as the next request."""

    http_status = 408
    code = "request_timeout"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Connection": "close"})
