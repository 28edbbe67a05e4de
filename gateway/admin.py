"""The admin API: models added to and removed from a running server, behind keys of its
own (``--admin-keys``).

- ``GET /admin/models``: every model of the fleet, its entry and its state;
- ``POST /admin/models`` ``{"name": ..., <the entry's fields>}``: a model joins the fleet,
  its entry validated as the fleet file's are (``embedder.tasks.fleet.parse_entry``);
- ``DELETE /admin/models/{model}``: the model leaves the fleet (new requests get 404),
  the jobs already queued or running for it finish, it is unloaded; then the answer.

The changes are made by a ``FleetAdmin`` (the model host of ``flotilla serve``); one that
also ``KeepsChanges`` says where they are written down, and the answers say so.

Only an admin key opens these routes: a client key (``--api-keys``) is refused as any
unknown one is, so a key handed to clients cannot change what the server serves. With
no admin key configured the routes answer 404 saying which flag turns them on (an
operator who tries learns what to set), and stay out of the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from embedder.core.errors import (
    FleetConflict,
    InvalidRequest,
    ModelExists,
    ModelNotFound,
    Unauthorized,
)
from embedder.core.fleet import FleetAdmin, ModelSpec
from embedder.core.rawjson import check_depth
from embedder.tasks.fleet import parse_entry
from gateway import answers
from gateway.errors import RouteNotFound
from gateway.keys import bearer_token, known_key
from gateway.openapi import ApiDocs, Errors
from gateway.schemas import ADMIN_ADD
from gateway.service import Gateway

MODELS = "/admin/models"
ONE = "/admin/models/{model:path}"  # a name may hold '/', as aliases do

ADMIN_ERRORS: Errors = {
    401: "The bearer token is missing or is not one of --admin-keys (client keys never are).",
    404: "The admin API is off (no --admin-keys), or no model has that name.",
}
ADD_ERRORS: Errors = {
    **ADMIN_ERRORS,
    408: "The body stopped arriving for --body-timeout-s; the connection closes.",
    409: "A model of the fleet already has the name, or one of the aliases.",
    413: "Body over --max-body-bytes.",
    422: "Malformed JSON, an entry the fleet file would refuse (the message names the "
    "field), or a relative adapter folder.",
    500: "The model joined, but --fleet-state could not be written: the change lasts "
    "until the server stops.",
}
REMOVE_ERRORS: Errors = {
    **ADMIN_ERRORS,
    409: "The model is the fleet's last (a fleet needs one).",
    500: "The model left, but --fleet-state could not be written: it is back at restart.",
}


@runtime_checkable
class KeepsChanges(Protocol):
    """A ``FleetAdmin`` that writes its changes down, so they survive a restart."""

    @property
    def kept_in(self) -> Path | None:
        """The file the changes are written to; None when they are not."""
        ...


class FleetRoutes:
    """The admin routes of one app, over the gateway's fleet and states and ``admin``."""

    def __init__(self, gateway: Gateway, admin: FleetAdmin) -> None:
        self.gateway = gateway
        self.admin = admin

    def authorize(self, request: Request) -> None:
        keys = self.gateway.config.limits.admin_keys
        if not keys:
            raise RouteNotFound(
                f"the admin API is off: start the server with --admin-keys "
                f"(FLOTILLA_ADMIN_KEYS) to {request.method} {request.url.path}"
            )
        if not known_key(bearer_token(request.headers.get("authorization", "")), keys):
            raise Unauthorized(
                "missing or unknown admin key: send 'Authorization: Bearer <key>' with a key "
                "of --admin-keys (client keys, --api-keys, are not accepted here)"
            )

    def kept(self) -> str:
        where = self.admin.kept_in if isinstance(self.admin, KeepsChanges) else None
        if where is None:
            return "lasts until the server stops; --fleet-state FILE keeps it"
        return f"kept in {where}"

    async def listing(self, request: Request) -> Response:
        self.authorize(request)
        fleet, states = self.gateway.fleet, self.gateway.states
        rows = [
            {
                "name": name,
                "task": spec.task,
                "aliases": list(spec.aliases),
                "load": spec.load,
                "pinned": spec.pinned,
                "state": states.state(name),
                "details": states.describe(name),
                "entry": spec.model_dump(mode="json", exclude={"name"}),
            }
            for name, spec in fleet.models.items()
        ]
        return JSONResponse({"object": "list", "kept": self.kept(), "data": rows})

    async def add(self, request: Request) -> Response:
        self.authorize(request)
        spec = parse_named_entry(await self.gateway.read_body(request))
        self.check_free(spec)
        try:
            # Shielded: a client that leaves must not cut the change (or its record) short.
            await asyncio.shield(self.admin.add_model(spec))
        except ValueError as exc:  # taken meanwhile, by a request beside this one
            raise ModelExists(str(exc)) from None
        entry = spec.model_dump(mode="json", exclude={"name"})
        return JSONResponse({"name": spec.name, "entry": entry, "kept": self.kept()}, 201)

    async def remove(self, request: Request, model: str) -> Response:
        self.authorize(request)
        try:
            await asyncio.shield(self.admin.remove_model(model))
        except ValueError as exc:  # the fleet's last model
            raise FleetConflict(str(exc)) from None
        return JSONResponse({"name": model, "kept": self.kept()})

    def check_free(self, spec: ModelSpec) -> None:
        """ModelExists when a model of the fleet has the name or an alias of ``spec``."""
        for name in (spec.name, *spec.aliases):
            try:
                owner = self.gateway.fleet.get(name).name
            except ModelNotFound:
                continue
            raise ModelExists(
                f"{name!r} is taken by model {owner!r}: choose another, or remove it first "
                f"(flotilla models remove {owner})"
            )


def parse_named_entry(body: bytes) -> ModelSpec:
    """``{"name": ..., <entry>}`` as its kind's spec; InvalidRequest (422) names the field."""
    check_depth(body)  # before the decoder recurses through it
    try:
        raw: Any = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidRequest('send a JSON object: {"name": "...", <the fleet entry\'s fields>}')
    name = raw.pop("name", None)
    if not isinstance(name, str) or not name:
        raise InvalidRequest("name: the model's name is required, a non-empty string")
    try:
        spec = parse_entry(name, raw)
    except ValidationError as exc:
        problems = "; ".join(_problem(error) for error in exc.errors())
        raise InvalidRequest(f"model {name!r}: {problems}") from None
    except ValueError as exc:  # not a mapping, an unknown task
        raise InvalidRequest(str(exc)) from None
    for adapter, folder in spec.adapters.items():
        if not folder.expanduser().is_absolute():
            raise InvalidRequest(
                f"model {name!r}: adapters.{adapter}: {str(folder)!r} is relative; give an "
                "absolute folder (an entry added while serving has no fleet file for it to "
                "be beside)"
            )
    return spec


def _problem(error: ErrorDetails) -> str:
    """One refused field as ``profiles.cpu.max_batch_tokens: <why> (got <value>)``."""
    where = ".".join(map(str, error["loc"]))
    value = error["input"]
    got = "" if isinstance(value, dict | list) else f" (got {value!r})"
    return f"{where}: {error['msg']}{got}" if where else f"{error['msg']}{got}"


def add_admin_routes(app: FastAPI, gateway: Gateway, admin: FleetAdmin, docs: ApiDocs) -> None:
    routes = FleetRoutes(gateway, admin)
    if gateway.config.limits.admin_keys:
        common: dict[str, Any] = {"tags": ["admin"]}
        listed = docs.answers(MODELS, answers.AdminModels, errors=ADMIN_ERRORS)
        added = docs.route(MODELS, ADMIN_ADD, status=201, errors=ADD_ERRORS)
        removed = docs.answers(ONE, answers.AdminModelRemoved, errors=REMOVE_ERRORS)
    else:  # off: out of the document, its request model included
        common, listed, added, removed = {"include_in_schema": False}, {}, {}, {}

    @app.get(MODELS, **common, **listed)
    async def list_fleet(request: Request) -> Response:
        """Every model of the fleet: its entry, its state, and what the host says of it."""
        return await routes.listing(request)

    @app.post(MODELS, **common, **added)
    async def add_model(request: Request) -> Response:
        """Add a model: requests may name it at once; a 'load: start' model starts
        loading, an on-demand one loads on its first request."""
        return await routes.add(request)

    @app.delete(ONE, **common, **removed)
    async def remove_model(request: Request, model: str) -> Response:
        """Remove a model: new requests get 404 at once; the answer comes once the jobs
        already queued or running for it have finished and it is unloaded."""
        return await routes.remove(request, model)
