"""The OpenAPI document for handlers that take the raw request.

The handlers never let FastAPI parse a body (the gateway reads only the routing fields),
so FastAPI cannot see what they take: each route says it here instead. ``ApiDocs.route``
gives the keyword arguments of ``add_api_route`` (or ``app.post``) that document a
route's request body, its 200 answer and its errors in the route's error shape;
``ApiDocs.install`` serves the request models in the document's components, where those
routes refer to them. One registry per app; a new route is one ``**docs.route(...)``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from gateway.errors import error_shape
from gateway.schemas import Bodies

REF = "#/components/schemas/{model}"
Errors = dict[int, str]  # status -> when a route answers it

# What a route that takes a body can answer besides 200, and when (docs/reference/api.md,
# 'Errors and limits').
BODY_ERRORS: Errors = {
    400: "The model cannot do this route's task (embedding with a reranker), or a prompt "
    "plus max_tokens over a generation model's context window (the message says both).",
    401: "--api-keys is set and the bearer token is missing or unknown.",
    404: "Unknown model, adapter or collection; the message lists the known ones.",
    408: "The body stopped arriving for --body-timeout-s; the connection closes.",
    409: "The embedded store's collection is owned by another process, or holds another "
    "model's vectors.",
    413: "Body over --max-body-bytes, more inputs than --max-inputs-per-request, or an "
    "input over the model's window without truncation.",
    422: "Malformed JSON, nesting deeper than 64 levels, a field of the wrong type, an "
    "empty or whitespace-only input (the message names its index), an unknown prompt.",
    429: "The model has --max-inflight-tokens admitted; Retry-After is when the tokens in "
    "flight will have drained at the rate it serves.",
    500: "The model failed on the batch; every request of that batch gets it.",
    503: "The model is loading or failed to load; Retry-After is set.",
    504: "No result before the deadline (--request-timeout-s or x-request-timeout-ms).",
}


class ApiDocs:
    """The request models of one app's raw-request routes, for its OpenAPI document."""

    def __init__(self) -> None:
        self.models: dict[str, type[BaseModel]] = {}

    def route(
        self, path: str, bodies: Bodies, *, status: int = 200, errors: Errors = BODY_ERRORS
    ) -> dict[str, Any]:
        """``openapi_extra`` and ``responses`` for the route at ``path``: it answers
        ``status`` with the body, or one of ``errors``."""
        name = bodies.request.__name__
        self.models[name] = bodies.request
        body = {"schema": {"$ref": REF.format(model=name)}}
        return {
            "openapi_extra": {
                "requestBody": {"required": True, "content": {"application/json": body}}
            },
            **self.answers(path, bodies.response, status=status, errors=errors),
        }

    @staticmethod
    def answers(
        path: str, response: object, *, status: int = 200, errors: Errors = BODY_ERRORS
    ) -> dict[str, Any]:
        """``responses`` alone, for a route that takes no body: its answer and its errors."""
        error = error_shape(path).model
        failed = {code: {"model": error, "description": why} for code, why in errors.items()}
        return {
            "status_code": status,
            "responses": {status: {"model": response, "description": "The answer."}, **failed},
        }

    def install(self, app: FastAPI) -> None:
        """Make ``app`` serve a document whose components hold every routed model."""
        build = app.openapi

        def openapi() -> dict[str, Any]:
            if app.openapi_schema is None:
                schema = build()
                components = schema.setdefault("components", {}).setdefault("schemas", {})
                for name, model in self.models.items():
                    definition = model.model_json_schema(ref_template=REF)
                    components.update(definition.pop("$defs", {}))
                    components[name] = definition
                app.openapi_schema = schema
            return app.openapi_schema

        app.openapi = openapi  # type: ignore[method-assign]
