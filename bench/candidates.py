"""The profiles a benchmark runs side by side: every registered runtime at every
precision it offers, a profile read from a file, and the tuned profile.

Each candidate is the fleet's model with one device profile overridden
(``spec.model_copy`` with that profile's fields updated), so a runtime or
precision added to the registries shows up as a row without a change here.
A candidate that fails to load is skipped with its reason, not fatal: a
runtime that refuses a precision says so with a classified error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from embedder.core.device import fingerprint
from embedder.core.fleet import DeviceKind, ModelSpec
from embedder.tasks.embed.spec import EncoderProfile
from embedder.tasks.embed.runtimes import PRECISIONS
from embedder.tuned import TunedProfiles, load_tuned, profile_for

# The host-path runtime has the real tokenizer and no model: its vectors mean
# nothing, so an engine row of it would be a speed without a result.
SKIPPED_RUNTIMES = frozenset({"emulated"})

T = TypeVar("T")


@dataclass(frozen=True)
class Candidate:
    key: str  # the row's name, e.g. "torch-bfloat16", "profile", "tuned"
    label: str
    spec: ModelSpec  # the fleet's model with the device profile overridden


def with_profile(spec: ModelSpec, device: DeviceKind, **changes: object) -> ModelSpec:
    """``spec`` with its ``device`` profile changed; the other profiles are left alone.
    Validated: a field the profile does not have, or a bad value, is a ValueError."""
    base = spec.profile(device).model_dump()
    profile = EncoderProfile.model_validate({**base, **changes})
    return spec.model_copy(update={"profiles": {**spec.profiles, device: profile}})


def precisions_of(
    runtime: str,
    device: DeviceKind,
    registry: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
) -> list[str]:
    """The precisions ``runtime`` offers on ``device``: ``embedder.tasks.embed.runtimes.PRECISIONS``
    (runtime -> device -> precisions); none for a runtime it does not list (the emulated
    device computes no model)."""
    offered = (PRECISIONS if registry is None else registry).get(runtime, {})
    return [str(p) for p in offered.get(device, ()) if p != "auto"]


def runtime_candidates(
    spec: ModelSpec,
    device: DeviceKind,
    runtimes: Iterable[str],
    precisions: Callable[[str, DeviceKind], Sequence[str]] = precisions_of,
    only: Sequence[str] | None = None,
) -> list[Candidate]:
    """One candidate per (runtime, precision); ``only`` keeps the named runtimes."""
    chosen: list[Candidate] = []
    for runtime in runtimes:
        if runtime in SKIPPED_RUNTIMES or (only is not None and runtime not in only):
            continue
        for dtype in precisions(runtime, device):
            chosen.append(
                Candidate(
                    key=f"{runtime}-{dtype}",
                    label=f"runtime {runtime}, dtype {dtype}",
                    spec=with_profile(spec, device, runtime=runtime, dtype=dtype),
                )
            )
    return chosen


def read_profile_file(path: Path) -> dict[str, Any]:
    """EncoderProfile fields from a YAML or JSON file (JSON is YAML): a mapping, checked."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SystemExit(f"cannot read the profile file {path}: {exc}") from None
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: a profile file holds a mapping of profile fields")
    unknown = sorted(set(data) - set(EncoderProfile.model_fields))
    if unknown:
        known = ", ".join(EncoderProfile.model_fields)
        raise SystemExit(f"{path}: unknown profile fields {unknown}; known: {known}")
    return data


def profile_candidate(spec: ModelSpec, device: DeviceKind, path: Path) -> Candidate:
    fields = read_profile_file(path)
    try:
        overridden = with_profile(spec, device, **fields)
    except ValueError as exc:
        raise SystemExit(f"{path}: {exc}") from None
    return Candidate("profile", f"profile from {path.name}", overridden)


def tuned_candidate(
    spec: ModelSpec, device: DeviceKind, tuned: TunedProfiles | None = None
) -> Candidate | str:
    """The tuned profile for this device, as ``flotilla serve`` would choose it, or why
    there is none (no entry for this fingerprint, or the fleet pins its choice)."""
    choice = profile_for(spec, device, fingerprint(device), tuned or load_tuned())
    if choice.source != "tuned":
        return f"no tuned profile: {choice.why}"
    profile = choice.profile
    label = f"tuned profile ({profile.runtime}, {profile.dtype})"
    return Candidate("tuned", label, choice.apply(spec, device))


def load_each(
    candidates: Iterable[Candidate], load: Callable[[ModelSpec], T]
) -> tuple[list[tuple[Candidate, T]], list[tuple[str, str]]]:
    """Load every candidate; one that raises is skipped with its reason."""
    loaded: list[tuple[Candidate, T]] = []
    skipped: list[tuple[str, str]] = []
    for candidate in candidates:
        try:
            loaded.append((candidate, load(candidate.spec)))
        except Exception as exc:  # any runtime's refusal; the row reports it
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            skipped.append((candidate.key, reason))
    return loaded, skipped
