"""The configuration reference (docs/hooks/settings_reference.py) lists every setting with
its flag, variable and default, under its GROUPS panel, for a flat settings object and for
one whose fields sit in sections."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from flotilla import settings

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "settings_reference.py"


def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settings_reference", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


hook = load_hook()


def test_every_setting_is_on_the_page() -> None:
    models, groups, prefix = hook.settings_models()
    assert settings.Settings in models and prefix == "FLOTILLA_"
    page = hook.render(models, groups, prefix)
    names = {s.name for model in models for s in hook.walk(model)}
    assert {s.name for s in hook.walk(settings.Settings)} <= names
    for name in names:
        dashed = name.replace("_", "-")
        env = f"FLOTILLA_{name.upper()}"
        assert f"`--{dashed}`{{#{env}}}" in page, name
        assert f"<br>`{env}` |" in page, name
    assert page.count("{#") == len(names)  # each once


def test_each_panel_is_a_heading_in_groups_order() -> None:
    page = hook.render(*hook.settings_models())
    headings = re.findall(r"^## (.+)$", page, flags=re.MULTILINE)
    assert headings[: len(settings.GROUPS)] == list(settings.GROUPS)


def test_a_row_gives_type_default_and_description() -> None:
    page = hook.render(*hook.settings_models())
    port = next(line for line in page.splitlines() if "{#FLOTILLA_PORT}" in line)
    assert "| int | `8080` |" in port
    assert "Port of the HTTP API" in port
    chunking = next(line for line in page.splitlines() if "{#FLOTILLA_CHUNKING}" in line)
    assert "`--no-chunking`" in chunking and "`true`" in chunking
    key = next(line for line in page.splitlines() if "{#FLOTILLA_QDRANT_API_KEY}" in line)
    assert "| str (secret) or none | unset |" in key


class Limits(BaseModel):
    max_pages: int = Field(default=64, alias="ocr_max_pages", description="Most pages.")
    dpi: float = Field(
        default=200.0, validation_alias=AliasChoices("ocr_pdf_dpi", "dpi"), description="Dots."
    )


class Queue(BaseModel):
    url: str | None = Field(default=None, alias="nats", description="Server | URL <here>.")
    storage: Literal["memory", "file"] = Field(default="file", description="Where.")


class Nested(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="APP_")

    port: int = Field(default=8080, description="Port.")
    ocr: Limits = Field(default_factory=Limits)
    jetstream: Queue = Field(default_factory=Queue)
    roots: list[Path] = Field(default_factory=list, description="Roots.")


def test_sections_are_walked_and_keep_their_flat_names() -> None:
    found = {s.path: s.name for s in hook.walk(Nested)}
    assert found == {
        "port": "port",
        "ocr.max_pages": "ocr_max_pages",
        "ocr.dpi": "ocr_pdf_dpi",
        "jetstream.url": "nats",
        "jetstream.storage": "storage",
        "roots": "roots",
    }
    groups = {"Server": ("port",), "OCR": ("ocr_max_pages", "ocr.dpi")}
    page = hook.render([Nested], groups, "APP_")
    assert re.findall(r"^## (.+)$", page, flags=re.MULTILINE) == [
        "Server",
        "OCR",
        "Jetstream",
        "Other",
    ]
    assert "`--ocr-max-pages`{#APP_OCR_MAX_PAGES}<br>`APP_OCR_MAX_PAGES`" in page
    assert "`--ocr-pdf-dpi`{#APP_OCR_PDF_DPI}<br>`APP_OCR_PDF_DPI`" in page
    nats = next(line for line in page.splitlines() if "{#APP_NATS}" in line)
    assert "str or none | unset |" in nats
    assert "Server \\| URL &lt;here&gt;." in nats  # a cell's pipes and brackets escaped
    assert '"memory", "file"' in page
    assert "list of Path, comma-separated | empty |" in page
