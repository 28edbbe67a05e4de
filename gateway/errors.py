"""Errors of the HTTP layer itself, in ``embedder.core.errors``' style (``http_status``,
``code``), and the shapes errors are written in: the one handler in ``gateway.app``
answers every error in its route's shape, and the OpenAPI document names the same."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from embedder.core.errors import FlotillaError
from gateway.answers import OpenAIError, TEIError


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


class RouteNotFound(FlotillaError):
    http_status = 404
    code = "not_found"


class MethodNotAllowed(FlotillaError):
    http_status = 405
    code = "method_not_allowed"

    def __init__(self, message: str, *, allow: str) -> None:
        super().__init__(message, headers={"Allow": allow})


class HttpError(FlotillaError):
    """Any other status the framework raises (Starlette's HTTPException), kept as it is."""

    code = "http_error"

    def __init__(self, message: str, *, status: int, headers: dict[str, str]) -> None:
        super().__init__(message, headers=headers)
        self.http_status = status


@dataclass(frozen=True, slots=True)
class ErrorShape:
    """How one family of routes writes an error: the body, and its documented model."""

    render: Callable[[FlotillaError], dict[str, object]]
    model: type[BaseModel]


OPENAI = ErrorShape(  # the OpenAI client reads error.message
    lambda exc: {"error": {"message": exc.message, "type": exc.code, "code": exc.http_status}},
    OpenAIError,
)
TEI = ErrorShape(lambda exc: {"error": exc.message, "error_type": exc.code}, TEIError)


def error_shape(path: str) -> ErrorShape:
    """The OpenAI shape under /v1/ and /v2/ (Cohere's SDK reads it too), TEI's everywhere
    else (unknown routes included)."""
    return OPENAI if path.startswith(("/v1/", "/v2/")) else TEI
