"""The one place errors become responses: flotilla's own classes, the framework's 404 and
405 (unknown routes and methods), and anything unexpected, each in its route's error shape
(``gateway.errors.error_shape``), so a client reads every error the same way."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from embedder.core.errors import FlotillaError, InvalidRequest
from gateway.errors import HttpError, MethodNotAllowed, RouteNotFound, error_shape


def error_response(path: str, exc: FlotillaError) -> Response:
    return JSONResponse(
        error_shape(path).render(exc), status_code=exc.http_status, headers=exc.headers
    )


def _from_http(request: Request, exc: HTTPException, app: FastAPI) -> FlotillaError:
    method, path = request.method, request.url.path
    if exc.status_code == 404:
        return RouteNotFound(
            f"no route {method} {path}: the API's routes are "
            + ", ".join(sorted(_routes(app)))
            + " (the OpenAPI document at /openapi.json describes each)"
        )
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        return MethodNotAllowed(f"{path} does not take {method}; it takes {allow}", allow=allow)
    return HttpError(str(exc.detail), status=exc.status_code, headers=dict(exc.headers or {}))


def _routes(app: FastAPI) -> set[str]:
    """``METHOD /path`` of every route the OpenAPI document shows."""
    return {
        f"{method} {route.path}"
        for route in app.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods or ()
        if method != "HEAD"
    }


def install(app: FastAPI) -> None:
    @app.exception_handler(FlotillaError)
    async def _flotilla(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, FlotillaError)
        return error_response(request.url.path, exc)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(request.url.path, _from_http(request, exc, app))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(request.url.path, InvalidRequest(f"invalid request: {exc}"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # A bug: the server's log has the traceback (the server logs it after this answer).
        error = FlotillaError(f"internal error ({type(exc).__name__}); see the server log")
        return error_response(request.url.path, error)
