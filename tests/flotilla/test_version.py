"""The version is written once (flotilla.__version__): the packaging metadata reads it, and
importing the package to learn it stays light."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import flotilla

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_metadata_says_the_packages_version() -> None:
    # A stale install (the version changed, the package not reinstalled) fails here;
    # `make install` reinstalls when flotilla/__init__.py changes.
    assert importlib.metadata.version("flotilla") == flotilla.__version__


def test_pyproject_reads_the_version_instead_of_writing_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "flotilla.__version__"}


def test_importing_flotilla_for_its_version_loads_no_model_library() -> None:
    probe = "import sys, flotilla; print(flotilla.__version__, 'torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [flotilla.__version__, "False"]
