"""Importing once: a folder stamped with its inputs' hashes is reused, not rewritten.

A fleet can name an imported model and let the first worker that loads it do the import,
so several processes may try at once: a lock file beside the folder lets one convert
while the others wait and then find its stamp. The folder is written under a temporary
name and renamed into place with its stamp already inside, so a crash half-way never
leaves a folder that looks complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from embedder.importers import Importer, get_importer
from embedder.importers.errors import DestinationInUse, SourceMissing

log = logging.getLogger(__name__)

STAMP_FILE = "flotilla-import.json"


@dataclass(frozen=True, slots=True)
class ImportResult:
    folder: Path
    cached: bool  # True: an earlier import of the same inputs was reused
    seconds: float
    stamp: dict[str, object]


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stamp(importer: Importer, sources: Mapping[str, Path]) -> dict[str, object]:
    files: dict[str, object] = {}
    for role, path in sorted(sources.items()):
        if not path.is_file():
            raise SourceMissing(f"importer {importer.name!r}: its {role} file {path} is missing")
        files[role] = {"path": str(path), "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return {"importer": importer.name, "version": importer.version, "sources": files}


def _identity(stamp: object) -> object:
    """What must match for a folder to be reused: importer, version and input hashes
    (not the paths: a reinstalled package holding the same bytes is the same input)."""
    if not isinstance(stamp, dict) or not isinstance(stamp.get("sources"), dict):
        return None
    hashes = {
        role: entry.get("sha256") if isinstance(entry, dict) else None
        for role, entry in stamp["sources"].items()
    }
    return (stamp.get("importer"), stamp.get("version"), hashes)


def read_stamp(folder: Path) -> dict[str, object] | None:
    try:
        stamp = json.loads((folder / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    with (out.parent / f".{out.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _check_replaceable(out: Path) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise DestinationInUse(f"{out} is a file; import into a folder")
    if any(out.iterdir()) and read_stamp(out) is None:
        raise DestinationInUse(
            f"{out} holds files that are not a flotilla import; choose an empty or new folder"
        )


def import_model(importer: Importer | str, out: Path, *, force: bool = False) -> ImportResult:
    """The model folder at ``out``, written by ``importer`` unless an import of the same
    inputs is already there (``force`` rewrites it anyway)."""
    start = time.perf_counter()
    importer = get_importer(importer) if isinstance(importer, str) else importer
    out = out.expanduser().absolute()
    sources = importer.find_sources()
    wanted = _stamp(importer, sources)

    def done(cached: bool) -> ImportResult:
        return ImportResult(out, cached, time.perf_counter() - start, wanted)

    if not force and _identity(read_stamp(out)) == _identity(wanted):
        return done(cached=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out):
        if not force and _identity(read_stamp(out)) == _identity(wanted):
            return done(cached=True)  # another process imported it while this one waited
        _check_replaceable(out)
        log.info("importing %s into %s", importer.name, out)
        write_stamped(out, lambda partial: importer.convert(sources, partial), STAMP_FILE, wanted)
    return done(cached=False)


def write_stamped(
    out: Path, build: Callable[[Path], None], stamp_file: str, stamp: Mapping[str, object]
) -> None:
    """``build`` a folder under a temporary name, put ``stamp`` inside, then rename it to
    ``out`` (replacing what was there): a crash half-way leaves no stamped folder. Call it
    holding ``locked(out)``."""
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        build(partial)
        (partial / stamp_file).write_text(json.dumps(stamp, indent=2) + "\n", "utf-8")
        if out.exists():
            out.rename(old)
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
