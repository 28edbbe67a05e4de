"""Annotating a request without fully parsing it.

Only the routing fields (model and adapter, or ``model: "base:adapter"``) are
decoded; msgspec skips the inputs without building Python objects for them.
Tokens are estimated from the body size, each text counted at most the model's window;
the worker decodes and tokenizes for real.
"""

from __future__ import annotations

import msgspec

from embedder.core.adapters import AdapterCatalog
from embedder.core.errors import TaskNotSupported
from embedder.core.fleet import FleetView, ModelSpec
from embedder.core.jobs import Job, split_model
from embedder.core.rawjson import decode_struct, estimate_tokens
from embedder.tasks.kind import TaskKind
from embedder.tasks.registry import kind_of


class _Routing(msgspec.Struct):
    model: str | None = None
    adapter: str | None = None


def model_for(fleet: FleetView, name: str | None, task: str, doing: str) -> ModelSpec:
    """The named model (else the fleet's first that answers ``task``), refused unless its
    kind answers ``task`` (a rerank takes an embedding model too); ``doing`` names the
    work in the message ("generate text")."""
    answering = kind_of(task).answering
    spec = default_model(fleet, task) if name is None else fleet.get(name)
    if spec.task not in answering:
        names = [n for n, s in fleet.models.items() if s.task in answering]
        raise TaskNotSupported(
            f"model {spec.name!r} is a {spec.task} model and cannot {doing}; "
            + (f"models that can: {', '.join(names)}" if names else "the fleet has none")
        )
    return spec


def routing_fields(body: bytes) -> tuple[str | None, str | None]:
    routing = decode_struct(body, _Routing)
    return requested(routing.model, routing.adapter)


def requested(model: str | None, adapter: str | None) -> tuple[str | None, str | None]:
    """The model and adapter a body names, ``"base:adapter"`` split as the OpenAI route
    allows. Only an absent field means "the default": a name given empty or blank stays a
    name, which the fleet refuses with the list of its models."""
    if model is not None and adapter is None:
        return split_model(model)
    return model, adapter


def default_model(fleet: FleetView, task: str) -> ModelSpec:
    """Routes without a model field (TEI) use the fleet's first model of the first kind
    that answers ``task`` (reranking falls back to an embedding model, which scores by
    cosine similarity), else the fleet's first."""
    for answering in kind_of(task).answering:
        for spec in fleet.models.values():
            if spec.task == answering:
                return spec
    return fleet.get(fleet.default_model)


def annotate(
    body: bytes,
    shape: str,
    kind: TaskKind,
    fleet: FleetView,
    *,
    now: float,
    timeout_s: float,
    bytes_per_token: float,
    priority: int = 0,
    adapters: AdapterCatalog | None = None,
) -> Job:
    name, adapter = routing_fields(body)
    spec = model_for(fleet, name, kind.name, kind.name)
    if adapter is not None:
        (adapters or AdapterCatalog(fleet)).find(spec.name, adapter)  # 404 names the known ones
    return Job.new(
        spec.name,
        shape,
        body,
        task=kind.name,
        now=now,
        timeout_s=timeout_s,
        bytes_per_token=bytes_per_token,
        priority=priority,
        adapter=adapter,
        est_tokens=estimate_tokens(body, bytes_per_token, spec.max_tokens),
    )
