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
from embedder.core.fleet import Fleet, ModelSpec
from embedder.core.jobs import TASK_OF_SHAPE, ApiShape, Job, Task, split_model
from embedder.core.rawjson import decode_struct, estimate_tokens


class _Routing(msgspec.Struct):
    model: str | None = None
    adapter: str | None = None


def model_for(fleet: Fleet, name: str | None, task: Task, doing: str) -> ModelSpec:
    """The named model (else the fleet's first for ``task``), refused unless its task is
    ``task``; ``doing`` names the work in the message ("generate text")."""
    spec = default_model(fleet, task) if name is None else fleet.get(name)
    if spec.task is not task:
        names = [n for n, s in fleet.models.items() if s.task is task]
        raise TaskNotSupported(
            f"model {spec.name!r} is a {spec.task} model and cannot {doing}; "
            + (f"models that can: {', '.join(names)}" if names else "the fleet has none")
        )
    return spec


def routing_fields(body: bytes) -> tuple[str | None, str | None]:
    routing = decode_struct(body, _Routing)
    model, adapter = routing.model, routing.adapter
    if model and adapter is None:  # "base:adapter", as the OpenAI route allows
        model, adapter = split_model(model)
    return model or None, adapter or None


def default_model(fleet: Fleet, task: Task) -> ModelSpec:
    """Routes without a model field (TEI) use the first model of the fleet for the task;
    reranking falls back to an embedding model, which scores by cosine similarity."""
    for spec in fleet.models.values():
        if spec.task is task:
            return spec
    return fleet.get(fleet.default_model)


def resolve_model(fleet: Fleet, name: str | None, task: Task) -> ModelSpec:
    spec = default_model(fleet, task) if name is None else fleet.get(name)
    if task is Task.RERANK and spec.task not in (Task.EMBED, Task.RERANK):
        raise TaskNotSupported(
            f"model {spec.name!r} is a {spec.task} model and cannot rerank; reranking models: "
            + ", ".join(n for n, s in fleet.models.items() if s.task in (Task.EMBED, Task.RERANK))
        )
    if task is Task.EMBED and spec.task is not Task.EMBED:
        raise TaskNotSupported(
            f"model {spec.name!r} is a {spec.task} model and cannot embed; embedding models: "
            + ", ".join(n for n, s in fleet.models.items() if s.task is Task.EMBED)
        )
    return spec


def annotate(
    body: bytes,
    shape: ApiShape,
    fleet: Fleet,
    *,
    now: float,
    timeout_s: float,
    bytes_per_token: float,
    priority: int = 0,
    adapters: AdapterCatalog | None = None,
) -> Job:
    name, adapter = routing_fields(body)
    spec = resolve_model(fleet, name, TASK_OF_SHAPE[shape])
    if adapter is not None:
        (adapters or AdapterCatalog(fleet)).find(spec.name, adapter)  # 404 names the known ones
    return Job.new(
        spec.name,
        shape,
        body,
        now=now,
        timeout_s=timeout_s,
        bytes_per_token=bytes_per_token,
        priority=priority,
        adapter=adapter,
        est_tokens=estimate_tokens(body, bytes_per_token, spec.max_tokens),
    )
