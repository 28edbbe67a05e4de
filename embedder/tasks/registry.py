"""Every task kind this build serves. A new kind is a folder under ``embedder/tasks``
with a ``KIND`` and one line here; the host, the fleet file and the gateway's routes
follow from it."""

from __future__ import annotations

from collections.abc import Mapping

from embedder.core.errors import TaskNotSupported
from embedder.tasks import embed, generate, ocr, rerank
from embedder.tasks.kind import Loader, TaskKind

TASKS: dict[str, TaskKind] = {
    kind.name: kind for kind in (embed.KIND, rerank.KIND, generate.KIND, ocr.KIND)
}


def kind_of(task: str) -> TaskKind:
    kind = TASKS.get(task)
    if kind is None:
        raise TaskNotSupported(f"no task kind {task!r}; known: {', '.join(sorted(TASKS))}")
    return kind


def routes() -> dict[str, tuple[TaskKind, str]]:
    """Every HTTP route a kind answers: path -> (kind, API shape)."""
    return {path: (kind, shape) for kind in TASKS.values() for path, shape in kind.routes.items()}


def kind_of_shape(shape: str) -> TaskKind:
    for kind in TASKS.values():
        if shape in kind.routes.values():
            return kind
    raise TaskNotSupported(f"no task kind decodes API shape {shape!r}")


def encoder_loaders(loader: Loader) -> Mapping[str, Loader]:
    """``loader`` for every kind on the encoder engine (embed, rerank): what a test or
    benchmark passes to load its own encoder runtimes."""
    return {name: loader for name, kind in TASKS.items() if kind.engine == embed.KIND.engine}
