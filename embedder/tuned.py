"""Tuned profiles: what `flotilla tune` chose per model and device fingerprint, and which
profile a model is served with.

A tuned profiles file maps a model to a device fingerprint (``embedder.core.device``) to
the chosen profile fields and what was measured. Serving reads, unless ``--tuned-file``
names the one file to read instead: the file shipped in the package
(``embedder/tuned.yaml``, package data) and, over it, the user's own file that
``flotilla tune`` writes (``<model-cache-dir>/tuned/tuned.yaml``): for one model and
one fingerprint the user's entry wins, the other shipped entries stay. Nothing writes
into the installed package.

A fleet entry opts in by leaving the choice to flotilla, ``dtype: auto`` in its profile
for that device: then a tuned profile for this device replaces the tuned
fields (runtime, dtype, threads, pass shape, batch budget) and the fleet keeps the rest
(requests per batch, wait, adapters). A fleet entry that pins a dtype (``float32``,
``bfloat16``, ...) is served exactly as written. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from embedder.core.fleet import DeviceKind, FleetError, ModelSpec, Profile
from embedder.importers import default_cache_dir
from embedder.tasks.embed.spec import EncoderProfile

# The fields the tuner chooses; a tuned entry holds exactly these.
TUNED_FIELDS = (
    "runtime",
    "dtype",
    "threads",
    "forward_tokens",
    "forward_max_sequences",
    "max_batch_tokens",
)
SHIPPED = "tuned.yaml"  # package data of ``embedder``
SHIPPED_LABEL = "shipped with flotilla"
HEADER = (
    "# Tuned profiles, written by `flotilla tune` (docs/guide/tuning.md): per model, per\n"
    "# device fingerprint, the profile fields it chose and what it measured. A fleet\n"
    "# entry with `dtype: auto` on that device is served with them.\n"
)
_S = TypeVar("_S", bound=ModelSpec)
# tuned: the shipped file, the user's tuned file or --tuned-file; cached: a tune on this
# machine kept in its cache; borrowed: tuned on the same CPU with another core count;
# tuning: the fleet's, a tune running.
ProfileSource = Literal["tuned", "fleet", "quick", "cached", "borrowed", "tuning"]


class Measured(BaseModel):
    """What the tuner measured for the chosen profile, and how."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens_per_s: float = Field(description="Real tokens (padding excluded) per second.")
    worst_cosine: float = Field(description="Worst cosine to torch fp32 on calibration texts.")
    ndcg_at_10: float | None = Field(default=None, description="On the labelled set, if run.")
    ndcg_at_10_fp32: float | None = None
    fp32_tokens_per_s: float | None = Field(
        default=None, description="torch fp32 at the fleet's shape, in the same run."
    )
    runner_up: dict[str, Any] | None = Field(
        default=None, description="The next best profile that passed the guard, with its tok/s."
    )
    calibration: str = Field(default="", description="The calibration texts.")
    other_load_cores: float | None = Field(
        default=None,
        description="The most cores other processes kept busy during a timing round kept; "
        "absent where it was not measured.",
    )
    disturbed_rounds: int | None = Field(
        default=None, description="Rounds timed again because other processes' load rose."
    )
    noisy: bool | None = Field(
        default=None,
        description="True when timings stayed disturbed after every repeat and the profile "
        "was written anyway (--allow-noisy): its figures are not this device's own.",
    )
    threads_why: str | None = Field(
        default=None, description="Why fewer threads than usable cores, with the figures."
    )
    date: str = ""
    flotilla_version: str = ""
    command: str = ""


class TunedEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: dict[str, Any]
    measured: Measured

    @field_validator("profile")
    @classmethod
    def _tuned_fields_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        if extra := set(value) - set(TUNED_FIELDS):
            raise ValueError(f"not tuned fields: {sorted(extra)}; tuned: {list(TUNED_FIELDS)}")
        EncoderProfile.model_validate(value)  # each value must be valid for its field
        return value


class TunedProfiles(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: dict[str, dict[str, TunedEntry]] = Field(default_factory=dict)
    # Where each entry was read from (model -> fingerprint -> file), for the profile's
    # `why`; set by ``serving_profiles``, never written to a file.
    read_from: dict[str, dict[str, str]] = Field(default_factory=dict, exclude=True)

    def entry(self, model: str, fingerprint: str) -> TunedEntry | None:
        return self.models.get(model, {}).get(fingerprint)

    def origin(self, model: str, fingerprint: str) -> str | None:
        return self.read_from.get(model, {}).get(fingerprint)

    def with_entry(self, model: str, fingerprint: str, entry: TunedEntry) -> TunedProfiles:
        models = {name: dict(per) for name, per in self.models.items()}
        models.setdefault(model, {})[fingerprint] = entry
        return TunedProfiles(models=models)


def layered(layers: Mapping[str, TunedProfiles]) -> TunedProfiles:
    """One set of profiles from several files, each labelled (a path, or the shipped
    file's label); a later layer's entry replaces an earlier one for the same model and
    fingerprint."""
    models: dict[str, dict[str, TunedEntry]] = {}
    read_from: dict[str, dict[str, str]] = {}
    for label, layer in layers.items():
        for model, per in layer.models.items():
            models.setdefault(model, {}).update(per)
            read_from.setdefault(model, {}).update(dict.fromkeys(per, label))
    return TunedProfiles(models=models, read_from=read_from)


def user_tuned_file(model_cache_dir: Path | None = None) -> Path:
    """Where ``flotilla tune`` writes when no file is named, and serving looks for the
    user's profiles: beside the per-machine cache, under ``--model-cache-dir``."""
    return (model_cache_dir or default_cache_dir()) / "tuned" / SHIPPED


def serving_profiles(tuned_file: Path | None, model_cache_dir: Path | None) -> TunedProfiles:
    """The profiles `flotilla serve` reads: ``tuned_file`` alone when given (a run that
    must not see the others: an empty file hides them); else the shipped ones with the
    user's over them."""
    if tuned_file is not None:
        return layered({f"from {tuned_file}": load_tuned(tuned_file)})
    user = user_tuned_file(model_cache_dir)
    return layered({SHIPPED_LABEL: load_tuned(), f"from {user}": load_tuned(user)})


def load_tuned(path: Path | None = None) -> TunedProfiles:
    """A tuned profiles file, the shipped one when ``path`` is None; a missing file is
    empty, except the shipped one (the package is broken); a malformed one is a
    FleetError naming it."""
    try:
        if path is None:
            text = resources.files("embedder").joinpath(SHIPPED).read_text(encoding="utf-8")
        else:
            text = path.read_text(encoding="utf-8")
        raw = yaml.safe_load(text)
    except FileNotFoundError as exc:
        if path is None:
            raise FleetError(
                f"the tuned profiles shipped in the package (embedder/{SHIPPED}) are missing: "
                "reinstall flotilla"
            ) from exc
        return TunedProfiles()
    except (OSError, yaml.YAMLError) as exc:
        raise FleetError(f"cannot read tuned profiles {path or SHIPPED}: {exc}") from exc
    try:
        return TunedProfiles.model_validate(raw or {})
    except ValidationError as exc:
        raise FleetError(f"tuned profiles {path or SHIPPED} are invalid:\n{exc}") from exc


def save_tuned(tuned: TunedProfiles, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump(
        tuned.model_dump(mode="json", exclude_none=True), sort_keys=False, allow_unicode=True
    )
    path.write_text(HEADER + body, encoding="utf-8")
    return path


@dataclass(frozen=True, slots=True)
class ProfileChoice:
    """The profile a model is served with on this device, and why."""

    profile: Profile
    source: ProfileSource
    fingerprint: str
    why: str

    def describe(self) -> dict[str, object]:
        return {"source": self.source, "fingerprint": self.fingerprint, "why": self.why}

    def apply(self, spec: _S, device: DeviceKind) -> _S:
        """``spec`` with this profile for ``device``: what runtimes read (spec.profile)."""
        return spec.model_copy(update={"profiles": {**spec.profiles, device: self.profile}})


def tunable(spec: ModelSpec, device: DeviceKind) -> str | None:
    """None when the fleet leaves this model's profile to tuning; else why not. Naming a
    runtime is a choice as much as pinning a dtype (the emulated device, say)."""
    profile = spec.profile(device)
    if profile.dtype != "auto":
        return f"the fleet pins dtype {profile.dtype}"
    if "runtime" in profile.model_fields_set:
        return f"the fleet names runtime {profile.runtime}"
    return None


# Runtimes that serve LoRA adapters: torch per row (peft's layers), the exported graphs as
# one merged graph per adapter. "emulated" computes no model and takes none.
ADAPTER_RUNTIMES = frozenset({"torch", "onnx", "openvino"})


def profile_for(
    spec: ModelSpec,
    device: DeviceKind,
    fingerprint: str,
    tuned: TunedProfiles,
    *,
    adapters: bool = False,
) -> ProfileChoice:
    """The tuned profile when the fleet opts in (dtype: auto) and the fingerprint
    matches; the fleet's own profile otherwise, saying why.

    A model that serves adapters (``adapters``: its fleet entry or its adapters folder
    names some, or a command asks for them) needs a runtime that takes them: when the
    fastest tuned one cannot, the tuned runner-up serves if it can, else the fleet's
    profile."""
    fleet = spec.profile(device)
    if (pinned := tunable(spec, device)) is not None:
        return ProfileChoice(fleet, "fleet", fingerprint, f"{pinned}; the fleet's profile")
    entry = tuned.entry(spec.name, fingerprint)
    if entry is None:
        why = f"no tuned profile for {fingerprint}; the fleet's profile"
        return ProfileChoice(fleet, "fleet", fingerprint, why)
    m = entry.measured
    tuned_on = f"tuned for {fingerprint} on {m.date or 'an unknown date'}"
    if (origin := tuned.origin(spec.name, fingerprint)) is not None:
        tuned_on += f" ({origin})"
    chosen, tokens_per_s = entry.profile, m.tokens_per_s
    runtime = chosen.get("runtime", fleet.runtime)
    if adapters and runtime not in ADAPTER_RUNTIMES:
        runner_up = m.runner_up or {}
        if runner_up.get("runtime") not in ADAPTER_RUNTIMES:
            why = f"{tuned_on}, but {runtime} cannot take adapters; the fleet's profile"
            return ProfileChoice(fleet, "fleet", fingerprint, why)
        chosen = {k: v for k, v in runner_up.items() if k in TUNED_FIELDS}
        tuned_on += f" ({runtime} cannot take adapters: the runner-up)"
        tokens_per_s = float(runner_up.get("tokens_per_s", 0.0))
    why = f"{tuned_on}: {tokens_per_s:,.0f} tok/s, worst cosine {m.worst_cosine:.5f}"
    return ProfileChoice(fleet.model_copy(update=chosen), "tuned", fingerprint, why)
