"""The configuration reference, rendered from the settings object at build time.

``docs/reference/configuration.md`` holds a marker; this MkDocs hook replaces it with
every field of ``flotilla.settings.Settings`` (and of the subclasses that add a command's
own settings, such as ``LoraSettings``): flag, environment variable, type, default and
description, under the panels of ``settings.GROUPS``. The page therefore cannot drift
from the code: a new setting appears on the next build.

Fields are walked recursively: a field whose type is a pydantic model is a section of
settings, and its own fields are listed. A field's flag and variable come from its alias
(``alias`` or ``validation_alias``) when it has one, else from its name, so a section
whose fields keep flat names (``ocr_max_pages`` inside ``settings.ocr``) renders the same
flags and variables as a flat object.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo

MARKER = "<!-- settings-reference -->"
OTHER = "Other"


@dataclass(frozen=True)
class Setting:
    name: str  # the flat name: --name-with-dashes, PREFIX + NAME
    path: str  # where it lives in the object: "port", "ocr.max_pages"
    section: str  # the section it is in ("" at the top)
    field: FieldInfo


def _alias(name: str, field: FieldInfo) -> str:
    for alias in (field.validation_alias, field.alias):
        if isinstance(alias, str):
            return alias
        if isinstance(alias, AliasChoices):
            first = next((c for c in alias.choices if isinstance(c, str)), None)
            if first is not None:
                return first
    return name


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _section(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds when it is a section of settings (optional or not)."""
    annotation = _unwrap(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if _section(a) is not None]
        return _section(models[0]) if len(models) == 1 else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def walk(model: type[BaseModel], path: str = "", section: str = "") -> Iterator[Setting]:
    """Every leaf setting of ``model``, sections entered in field order."""
    for name, field in model.model_fields.items():
        inner = _section(field.annotation)
        where = f"{path}{name}"
        if inner is not None:
            yield from walk(inner, f"{where}.", section or name)
        else:
            yield Setting(_alias(name, field), where, section, field)


def type_name(annotation: Any) -> str:
    annotation = _unwrap(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return ", ".join(
            f'"{v}"' if isinstance(v, str) else str(v) for v in typing.get_args(annotation)
        )
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(annotation))
    if origin in (list, tuple, set, frozenset):
        return f"list of {type_name(typing.get_args(annotation)[0])}, comma-separated"
    if annotation is type(None):
        return "none"
    if annotation is SecretStr:  # a str to whoever sets it; only its printing is masked
        return "str (secret)"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def default_text(field: FieldInfo) -> str:
    default = field.get_default(call_default_factory=True)
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, Enum):
        default = default.value
    if isinstance(default, list | tuple | set | frozenset):
        return f"`{','.join(map(str, default))}`" if default else "empty"
    return f"`{default}`"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: no pipes, no stray HTML, one line."""
    text = " ".join(text.split())
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def variable(setting: Setting, env_prefix: str) -> str:
    return f"{env_prefix}{setting.name.upper()}"


def row(setting: Setting, env_prefix: str) -> str:
    """A setting's row. The flag as Typer spells it carries the variable's name as its id,
    so other pages link to a setting (configuration.md#FLOTILLA_REQUEST_TIMEOUT_S) without
    meeting a panel heading's own anchor (the panel Kafka, the setting kafka)."""
    env = variable(setting, env_prefix)
    dashed = setting.name.replace("_", "-")
    flag = f"`--{dashed}`{{#{env}}}"
    if _unwrap(setting.field.annotation) is bool:
        flag += f" / `--no-{dashed}`"
    return (
        f"| {flag}<br>`{env}` | {_cell(type_name(setting.field.annotation))} "
        f"| {default_text(setting.field)} | {_cell(setting.field.description or '')} |"
    )


def grouped(
    settings: Iterable[Setting], groups: Mapping[str, Iterable[str]]
) -> dict[str, list[Setting]]:
    """Settings under their GROUPS panel (found by flat name or by path), in the panel's
    order; a setting in no panel goes under its section's name, or OTHER at the top."""
    place = {name: title for title, names in groups.items() for name in names}
    rank = {name: i for names in groups.values() for i, name in enumerate(names)}
    out: dict[str, list[Setting]] = {title: [] for title in groups}
    for setting in settings:
        title = place.get(setting.name) or place.get(setting.path)
        if title is None:
            title = setting.section.replace("_", " ").capitalize() if setting.section else OTHER
        out.setdefault(title, []).append(setting)
    for title in groups:
        out[title].sort(key=lambda s: rank.get(s.name, rank.get(s.path, len(rank))))
    return {title: rows for title, rows in out.items() if rows}


def render(
    models: Iterable[type[BaseModel]],
    groups: Mapping[str, Iterable[str]],
    env_prefix: str,
) -> str:
    """One table per panel over the settings of ``models`` (a setting two models share,
    such as a subclass's inherited ones, is listed once)."""
    seen: dict[str, Setting] = {}
    for model in models:
        for setting in walk(model):
            seen.setdefault(setting.name, setting)
    parts = []
    for title, rows in grouped(seen.values(), groups).items():
        parts += [
            f"## {title}",
            "",
            "| Flag / variable | Type | Default | Description |",
            "|---|---|---|---|",
            *(row(s, env_prefix) for s in rows),
            "",
        ]
    return "\n".join(parts)


def settings_models() -> tuple[list[type[BaseModel]], Mapping[str, Iterable[str]], str]:
    """The settings object, the subclasses flotilla.settings defines beside it, the panels,
    and the variables' prefix."""
    from flotilla import settings

    root = settings.Settings
    models: list[type[BaseModel]] = [root]
    models += [
        cls
        for cls in vars(settings).values()
        if isinstance(cls, type) and issubclass(cls, root) and cls is not root
    ]
    prefix = str(root.model_config.get("env_prefix", ""))
    return models, getattr(settings, "GROUPS", {}), prefix


# -- the MkDocs hooks ---------------------------------------------------------------------


def on_config(config: Any) -> Any:
    # The checkout's own settings, however mkdocs was started (its script's sys.path holds
    # the environment, which may have flotilla installed from another checkout).
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render(*settings_models()))
