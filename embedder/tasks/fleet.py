"""The fleet file: a YAML map of model name -> entry, each entry parsed by its task
kind's spec (``task:``, ``embed`` when left out), so a field of another kind is a load
error that names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from embedder.core.fleet import Fleet, FleetError, ModelSpec
from embedder.tasks.registry import TASKS

DEFAULT_TASK = "embed"
# The bundled fleet: the models whose weights ship in packages flotilla depends on.
DEFAULT_FLEET = Path(__file__).resolve().parent.parent / "fleet.yaml"


def parse_entry(name: str, entry: Any) -> ModelSpec:
    """One entry as its kind's spec; ValueError (naming the model) when it is not one."""
    if not isinstance(entry, dict):
        raise ValueError(f"model {name!r}: an entry is a mapping, not {type(entry).__name__}")
    task = entry.get("task", DEFAULT_TASK)
    kind = TASKS.get(str(task))
    if kind is None:
        raise ValueError(
            f"model {name!r}: task {task!r} is not a task kind; known: {', '.join(sorted(TASKS))}"
        )
    return kind.spec.model_validate({"name": name, **entry, "task": kind.name})


def parse_fleet(raw: Any) -> Fleet:
    """A fleet from its file's data (``{"models": {name: entry}}``)."""
    models = raw.get("models") if isinstance(raw, dict) else None
    if not isinstance(models, dict):
        raise ValueError("a fleet is a mapping with 'models': a map of model name -> entry")
    specs = {name: parse_entry(name, entry) for name, entry in models.items()}
    return Fleet.model_validate({**raw, "models": specs})


def load_fleet(path: Path | None = None) -> Fleet:
    path = path or DEFAULT_FLEET
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FleetError(f"cannot read fleet file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise FleetError(f"fleet file {path} is not valid YAML: {exc}") from exc
    try:
        return parse_fleet(adapters_beside(raw, path.resolve().parent))
    except (ValidationError, ValueError) as exc:
        raise FleetError(f"fleet file {path} is invalid:\n{exc}") from exc


def adapters_beside(raw: object, folder: Path) -> object:
    """Relative adapter folders are read from beside the fleet file (``{"models": ...}``),
    so a fleet ships its adapters with it (the bundled ones: ``embedder/bundled_adapters/``);
    the same for a file of entries sent to a running server."""
    models = raw.get("models") if isinstance(raw, dict) else None
    if not isinstance(models, dict):
        return raw
    for entry in models.values():
        adapters = entry.get("adapters") if isinstance(entry, dict) else None
        if isinstance(adapters, dict):
            entry["adapters"] = {
                name: str(folder / where)
                if isinstance(where, str) and not Path(where).expanduser().is_absolute()
                else where
                for name, where in adapters.items()
            }
    return raw
