"""The fleet file: which models a deployment serves and how each is tuned.

A YAML file maps a model name to where its weights live, what task it does
and one profile per device kind. Loading it never imports torch, so the
gateway can read the fleet to validate model names and limits.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from embedder.core.errors import FlotillaError, InvalidRequest, ModelNotFound
from embedder.importers import IMPORTERS, default_cache_dir
from embedder.core.jobs import Task

DeviceKind = Literal["cpu", "cuda"]
Precision = Literal["auto", "float32", "bfloat16", "bfloat16-autocast", "float16", "int8"]
PromptUse = Literal["query", "document"]  # what a text is for, when a request says


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
                    f"package {self.package!r} is not installed: pip install --no-deps "
                    f"{self.package.replace('_', '-')}"
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
    """How one model runs on one kind of device: the knobs the tuner sets."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: str = Field(
        default="torch",
        description="Key into the runtime registry (embedder.tasks.embed.runtimes.RUNTIMES): torch, "
        "onnx, openvino, or emulated (the real tokenizer, no model: the host path alone).",
    )
    dtype: Precision = Field(
        default="auto",
        description="The arithmetic: 'float32'; 'bfloat16' (bf16 weights); "
        "'bfloat16-autocast' (fp32 weights, bf16 matmuls); 'float16' (CUDA); 'int8' "
        "(quantized matmuls, where the runtime has them). 'auto' measures the runtime's "
        "candidates at load and keeps the fastest whose vectors stay within cosine 0.999 "
        "of fp32; `flotilla tune` searches more widely, ahead of time.",
    )
    threads: int = Field(
        default=0,
        ge=0,
        description="CPU threads for this model's forward passes; 0 takes the --threads "
        "setting. Tuned per device: past a point more threads only add contention.",
    )
    latency_target_ms: float | None = Field(
        default=None,
        gt=0,
        description="Steer the wait for a fuller batch toward this p50 latency, between 0 "
        "and max_wait_ms, instead of always waiting max_wait_ms: one client gets near "
        "single-request latency, many get full batches. None keeps the fixed wait.",
    )
    max_batch_tokens: int = Field(
        default=8192,
        gt=0,
        description="Estimated tokens the worker takes per batch. Generation: the KV budget, "
        "each running sequence counting its prompt plus the new tokens it may still make.",
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
    forward_tokens: int = Field(
        default=2048,
        gt=0,
        description="Padded tokens per forward pass; small on CPU (cache), large on GPU.",
    )
    forward_max_sequences: int = Field(default=64, gt=0, description="Sequences per forward pass.")
    prefill_chunk_tokens: int = Field(
        default=128,
        gt=0,
        description="Generation: a prompt is prefilled this many tokens per step, between "
        "the decode steps of the running sequences. Smaller: running streams stall less "
        "while a long prompt joins; larger: the prompt's first token comes sooner.",
    )
    max_resident_adapters: int = Field(
        default=8,
        gt=0,
        description="LoRA adapters kept loaded; the least recently used one is unloaded "
        "when another is needed. Each costs its weights' memory (a few MB for rank 16).",
    )
    mix_adapters: bool = Field(
        default=True,
        description="Requests for different adapters of a model share one batch (each row "
        "runs its own adapter) instead of waiting for a batch of their own: fuller batches "
        "when traffic spreads over many adapters, at a per-pass cost (bench.adapters).",
    )
    ocr_detect_max_side: int = Field(
        default=1280,
        ge=32,
        description="OCR: a page is scaled down until its longer side is at most this many "
        "pixels before detection (lines are still read from the full-resolution page). "
        "Larger finds smaller print and costs detection time with the square of it.",
    )
    ocr_detect_pixels: int = Field(
        default=2_000_000,
        gt=0,
        description="OCR: padded pixels per detection pass; pages of similar shape share a "
        "pass up to this. Small on a CPU (cache), large on a GPU; one page over it runs alone.",
    )
    ocr_recognize_lines: int = Field(
        default=32,
        gt=0,
        description="OCR: text lines per recognition pass, from every page and request the "
        "worker holds. More lines per pass amortize its cost; past a point a CPU gains "
        "nothing and a pass holds the device longer.",
    )
    ocr_recognize_width_ratio: float = Field(
        default=2.0,
        ge=1.0,
        description="OCR: lines share a recognition pass only while the widest is at most "
        "this many times the narrowest (each is padded to the widest). Lower wastes less on "
        "padding, higher makes fewer, fuller passes.",
    )


class OcrParts(BaseModel):
    """An OCR model's detector and character set beside its recognizer (the source's
    'file'): a PP-OCR detection/recognition pair of ONNX files. Paths are relative to the
    source folder (or absolute); thresholds are PaddleOCR's defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    detector: str = Field(description="The text detector (DB), an ONNX file.")
    characters: str | None = Field(
        default=None,
        description="The recognizer's character dictionary, one character a line; None "
        "reads it from the recognizer's ONNX metadata ('character', as PaddleOCR exports).",
    )
    detector_mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    detector_std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    line_height: int = Field(default=48, gt=0, description="The recognizer's input height.")
    pixel_threshold: float = Field(
        default=0.3, gt=0, lt=1, description="Detection map value that counts as text."
    )
    box_threshold: float = Field(
        default=0.5, gt=0, lt=1, description="Mean detection score a line box needs."
    )
    unclip_ratio: float = Field(
        default=1.6, gt=0, description="How far a detected box is grown to cover its line."
    )
    min_confidence: float = Field(
        default=0.5, ge=0, le=1, description="Lines read with less confidence are dropped."
    )


class ModelSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    source: Source
    task: Task = Task.EMBED
    pooling: Literal["model", "mean", "cls", "last"] = Field(
        default="model", description="'model' keeps the pooling the model folder configures."
    )
    normalize: bool = True
    max_tokens: int = Field(
        default=512,
        gt=0,
        description="Longest input, in model tokens; for a generation model its context "
        "window (prompt plus generated tokens).",
    )
    chat_template: str | None = Field(
        default=None,
        description="Generation: the Jinja chat template that turns messages into a prompt; "
        "None takes the one in the model's tokenizer config.",
    )
    max_new_tokens: int = Field(
        default=256,
        gt=0,
        description="Generation: tokens a request gets when it sets no max_tokens. Each "
        "running request reserves its prompt plus these in the KV budget "
        "(max_batch_tokens): larger defaults admit fewer requests at once.",
    )
    aliases: tuple[str, ...] = ()
    adapters: dict[str, Path] = Field(
        default_factory=dict,
        description="LoRA adapters served per request as 'model:adapter': name -> folder.",
    )
    prompts: dict[str, str] = Field(
        default_factory=dict,
        description="Named prefixes the model was trained with (e5: query -> 'query: '); a "
        "request picks one by name (TEI's prompt_name) or by use (input_type).",
    )
    default_prompt: str | None = Field(
        default=None, description="The prompt of requests that name neither prompt nor use."
    )
    query_prompt: str | None = Field(
        default=None,
        description="The prompt of queries: input_type query, search queries, rerank queries.",
    )
    document_prompt: str | None = Field(
        default=None,
        description="The prompt of documents: input_type document or passage, ingested "
        "documents, the documents of a rerank.",
    )
    ocr: OcrParts | None = Field(
        default=None,
        description="OCR (task: ocr): the detector and characters beside the recognizer, "
        "which is the source's 'file'.",
    )
    profiles: dict[DeviceKind, Profile] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ocr_parts(self) -> ModelSpec:
        if self.task is Task.OCR and (self.ocr is None or self.source.file is None):
            raise ValueError(
                "an ocr model needs its recognizer as the source's 'file' and an 'ocr' entry "
                "naming its detector (and characters, unless the recognizer carries them)"
            )
        if self.task is not Task.OCR and self.ocr is not None:
            raise ValueError(f"'ocr' is for task: ocr models, not {self.task}")
        return self

    @model_validator(mode="after")
    def _prompts_exist(self) -> ModelSpec:
        for field in ("default_prompt", "query_prompt", "document_prompt"):
            name = getattr(self, field)
            if name is not None and name not in self.prompts:
                known = ", ".join(sorted(self.prompts)) or "none"
                raise ValueError(f"{field} {name!r} is not one of the prompts ({known})")
        return self

    def profile(self, device: DeviceKind) -> Profile:
        return self.profiles.get(device) or self.profiles.get("cpu") or Profile()

    def prompt_prefix(self, prompt_name: str | None = None, use: PromptUse | None = None) -> str:
        """The text to put before each input: the named prompt, else the use's prompt (none
        when the model has none for that use), else the default prompt. A model without
        prompts ignores the use; naming a prompt it lacks is an InvalidRequest (422)."""
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                known = ", ".join(repr(p) for p in sorted(self.prompts))
                raise InvalidRequest(
                    f"model {self.name!r} has no prompt {prompt_name!r}; "
                    + (f"its prompts: {known}" if known else "it defines no prompts")
                )
            return self.prompts[prompt_name]
        if use == "query":
            chosen = self.query_prompt
        elif use == "document":
            chosen = self.document_prompt
        else:
            chosen = self.default_prompt
        return self.prompts[chosen] if chosen is not None else ""


class Fleet(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: dict[str, ModelSpec]

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("models"), dict):
            data = dict(data)
            data["models"] = {
                name: {"name": name, **spec} if isinstance(spec, dict) else spec
                for name, spec in data["models"].items()
            }
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


# The bundled fleet: the models whose weights ship in packages flotilla depends on.
DEFAULT_FLEET = Path(__file__).resolve().parent / "fleet.yaml"


def load_fleet(path: Path | None = None) -> Fleet:
    path = path or DEFAULT_FLEET
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FleetError(f"cannot read fleet file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise FleetError(f"fleet file {path} is not valid YAML: {exc}") from exc
    try:
        return Fleet.model_validate(_adapters_beside(raw, path.resolve().parent))
    except ValidationError as exc:
        raise FleetError(f"fleet file {path} is invalid:\n{exc}") from exc


def _adapters_beside(raw: object, folder: Path) -> object:
    """Relative adapter folders are read from beside the fleet file, so a fleet ships its
    adapters with it (the bundled ones: ``embedder/bundled_adapters/``)."""
    models = raw.get("models") if isinstance(raw, dict) else None
    if not isinstance(models, dict):
        return raw
    for entry in models.values():
        adapters = entry.get("adapters") if isinstance(entry, dict) else None
        if isinstance(adapters, dict):
            entry["adapters"] = {
                name: str(folder / where)
                if isinstance(where, str) and not Path(where).expanduser().is_absolute()
                else where
                for name, where in adapters.items()
            }
    return raw
