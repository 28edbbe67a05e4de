"""The tuned profiles of this machine: what a tune here chose, kept in a user cache file,
so the next start serves it from the first request without tuning again.

One YAML file, ``<model cache>/tuned/profiles.yaml`` (``--model-cache-dir``, else
``$XDG_CACHE_HOME/flotilla/models`` or ``~/.cache/flotilla/models``), shaped like the
shipped ``embedder/tuned.yaml`` (model, then device fingerprint, then the tuned fields
and what was measured), each entry adding what it was measured with: the digest of the
model's weights folder and the versions of the runtime libraries. An entry whose weights
or libraries differ from what this machine has now is stale: ignored, said in the log,
and replaced by the next tune.

A profile tuned on the same CPU model and instruction set with another core count is
*borrowed* (``borrow``): its threads scaled to this machine's cores, until a tune here
confirms or replaces it. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from embedder.core.fleet import ModelSpec
from embedder.importers import default_cache_dir
from embedder.importers.cache import locked
from embedder.tasks.embed.runtimes.export import folder_digest, library_versions
from embedder.tuned import TunedEntry, TunedProfiles

log = logging.getLogger(__name__)

# The libraries a tuned profile's speed depends on: a new build may change the ranking.
LIBRARIES = ("torch", "onnxruntime", "openvino")
CACHE_FILE = "profiles.yaml"
DIGESTS_FILE = "digests.json"
HEADER = (
    "# Profiles tuned on this machine by flotilla (docs/guide/tuning.md): per model, per\n"
    "# device fingerprint, with the weights digest and library versions they were\n"
    "# measured with. Safe to delete: the next start tunes again.\n"
)


class CachedEntry(TunedEntry):
    weights: str = Field(description="folder_digest of the model's weights folder.")
    libraries: dict[str, str] = Field(description="The runtime libraries' versions.")


class MachineProfiles(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: dict[str, dict[str, CachedEntry]] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Identity:
    """What a profile is measured with on this machine, besides its device."""

    weights: str
    libraries: dict[str, str]

    def stale(self, entry: CachedEntry) -> str | None:
        """Why ``entry`` no longer fits this machine; None when it does."""
        if entry.weights != self.weights:
            return "the model's weights changed"
        changed = sorted(
            f"{name} {entry.libraries.get(name, 'absent')} -> {version}"
            for name, version in self.libraries.items()
            if entry.libraries.get(name, "absent") != version
        )
        return f"libraries changed: {', '.join(changed)}" if changed else None


def cache_file(model_cache_dir: Path | None = None) -> Path:
    """The per-machine tuned profiles, beside the models imported into the cache."""
    return (model_cache_dir or default_cache_dir()) / "tuned" / CACHE_FILE


def identity_of(spec: ModelSpec, cache: Path) -> Identity:
    """This machine's weights digest of ``spec`` and its library versions. Resolving an
    import source imports it (as loading does)."""
    folder = spec.source.resolve()
    return Identity(
        weights_digest(folder, cache.parent / DIGESTS_FILE), library_versions(*LIBRARIES)
    )


def weights_digest(folder: Path, memo: Path) -> str:
    """``folder_digest`` of ``folder``, remembered in ``memo`` by the files' names, sizes
    and modification times: hashing reads every byte (about a second for 500 MB of
    weights), while a start on unchanged files needs only a stat of each."""
    files = sorted(p for p in folder.resolve().rglob("*") if p.is_file())
    stats = [
        (str(p.relative_to(folder.resolve())), p.stat().st_size, p.stat().st_mtime_ns)
        for p in files
    ]
    signature = hashlib.sha256(json.dumps(stats).encode()).hexdigest()
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    key = str(folder.resolve())
    if isinstance(seen := known.get(key), dict) and seen.get("signature") == signature:
        return str(seen["digest"])
    digest = folder_digest(folder)
    known[key] = {"signature": signature, "digest": digest}
    _write(memo, json.dumps(known, indent=1) + "\n")
    return digest


def read_cache(path: Path) -> MachineProfiles:
    """The cache file; empty when missing, and when unreadable (said in the log): a cache
    never stops a model from serving."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        return MachineProfiles.model_validate(raw or {})
    except FileNotFoundError:
        return MachineProfiles()
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        log.warning("ignoring the tuned profiles cache %s: %s", path, exc)
        return MachineProfiles()


def record(path: Path, model: str, fingerprint: str, entry: TunedEntry, identity: Identity) -> None:
    """Keep ``entry`` for ``model`` on ``fingerprint``, replacing what was there; other
    processes writing the same file wait their turn (a lock), and a reader never sees a
    half-written file."""
    cached = CachedEntry(
        profile=entry.profile,
        measured=entry.measured,
        weights=identity.weights,
        libraries=identity.libraries,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path):
        known = read_cache(path)
        models = {name: dict(per) for name, per in known.models.items()}
        models.setdefault(model, {})[fingerprint] = cached
        body = yaml.safe_dump(
            MachineProfiles(models=models).model_dump(mode="json", exclude_none=True),
            sort_keys=False,
            allow_unicode=True,
        )
        _write(path, HEADER + body)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


# -- borrowing ------------------------------------------------------------------------


def split_cores(fingerprint: str) -> tuple[str, int] | None:
    """A CPU fingerprint's part before the core count, and the count; None for a GPU's
    or one without a count."""
    base, _, cores = fingerprint.rpartition(":")
    if not fingerprint.startswith("cpu:") or not cores.endswith("c") or not cores[:-1].isdigit():
        return None
    return base, int(cores[:-1])


def scale_threads(threads: int, tuned_cores: int, cores: int) -> int:
    """Threads for this machine's ``cores`` from a profile tuned with ``threads`` of
    ``tuned_cores``: all of them if it used all, else the same share, at least 1. 0 (every
    core) stays 0."""
    if threads <= 0:
        return threads
    if threads >= tuned_cores:
        return cores
    return max(1, round(threads * cores / tuned_cores))


def _scaled(entry: TunedEntry, tuned_cores: int, cores: int) -> TunedEntry:
    profile = dict(entry.profile)
    if "threads" in profile:
        profile["threads"] = scale_threads(int(profile["threads"]), tuned_cores, cores)
    measured = entry.measured
    if measured.runner_up is not None and "threads" in measured.runner_up:
        threads = scale_threads(int(measured.runner_up["threads"]), tuned_cores, cores)
        measured = measured.model_copy(
            update={"runner_up": {**measured.runner_up, "threads": threads}}
        )
    return TunedEntry(profile=profile, measured=measured)


Source = Literal["cached", "borrowed"]


@dataclass(frozen=True, slots=True)
class Found:
    """A profile for this machine from outside the shipped file's exact match."""

    entry: TunedEntry  # threads already scaled when borrowed
    source: Source
    fingerprint: str  # where it was tuned
    why: str


def lookup(
    model: str,
    fingerprint: str,
    cached: MachineProfiles,
    shipped: TunedProfiles,
    identity: Identity | None,
) -> Found | None:
    """This machine's own fresh cache entry; else one borrowed from the same CPU with
    another core count, from either file; else None. ``identity`` None: the cache has no
    entry for the model (so none was computed)."""
    own = cached.models.get(model, {}).get(fingerprint)
    if own is not None and identity is not None:
        if (why := identity.stale(own)) is None:
            return Found(own, "cached", fingerprint, "kept in this machine's tuned profiles")
        log.info(
            "%s: the cached tuned profile for %s is stale (%s): ignored", model, fingerprint, why
        )
    return borrow(model, fingerprint, cached, shipped, identity)


def borrow(
    model: str,
    fingerprint: str,
    cached: MachineProfiles,
    shipped: TunedProfiles,
    identity: Identity | None,
) -> Found | None:
    """The entry tuned on this CPU model and instruction set with the core count nearest
    this machine's (more cores on a tie), shipped or cached (fresh ones only)."""
    here = split_cores(fingerprint)
    if here is None:
        return None
    base, cores = here
    options: list[tuple[int, str, TunedEntry]] = []
    for fp, shipped_entry in shipped.models.get(model, {}).items():
        options.append((0, fp, shipped_entry))
    for fp, cached_entry in cached.models.get(model, {}).items():
        if identity is not None and identity.stale(cached_entry) is None:
            options.append((1, fp, cached_entry))
    near: list[tuple[int, int, int, str, TunedEntry]] = []
    for order, fp, option in options:
        there = split_cores(fp)
        if there is not None and there[0] == base and there[1] != cores:
            near.append((abs(there[1] - cores), -there[1], order, fp, option))
    if not near:
        return None
    _, minus_cores, _, fp, entry = min(near, key=lambda n: n[:3])
    scaled = _scaled(entry, -minus_cores, cores)
    why = f"borrowed from {-minus_cores} cores, threads scaled to this machine's {cores}"
    return Found(scaled, "borrowed", fp, why)
