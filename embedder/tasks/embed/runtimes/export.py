"""Exported graphs, built once and cached by content hash.

A model folder becomes one ONNX graph: a bi-encoder's Transformer and Pooling (the
folder's pooling or the fleet's override) returning the pooled, unnormalized vector; a
cross-encoder's logits. A bi-encoder's LoRA adapter becomes a graph of its own, the
adapter merged into the weights (``merged_export``). Inputs are ``input_ids``,
``attention_mask`` and (where the model reads them) ``token_type_ids``, with dynamic
batch and sequence axes. The tokenizer is
saved beside the graph, so a runtime that loads an export never loads the torch model.

Every artifact (the export, and what runtimes derive from it: a fused graph, an int8
graph, an OpenVINO model) lives in its own folder under ``<model cache>/exports``, named
by the hash of everything it was built from: the model folder's files, the options, the
library versions. A folder is reused while that hash matches, so a second load only hashes
the model files (a fraction of a second for all-MiniLM-L6-v2's 90 MB) and a change of
weights, pooling or library builds a new one. Torch is imported only to build an export.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import logging
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedder.core.errors import AdapterInvalid
from embedder.core.jobs import Task
from embedder.importers import default_cache_dir
from embedder.importers.cache import file_sha256, locked, write_stamped
from embedder.tasks.embed.spec import EncoderSpec

log = logging.getLogger(__name__)

STAMP_FILE = "flotilla-export.json"
GRAPH_FILE = "model.onnx"
TOKENIZER_DIR = "tokenizer"
# Bump when what ``_export`` writes changes: older exports are then rebuilt.
EXPORT_VERSION = 1
OPSET = 17
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
EXPORT_LIBRARIES = ("torch", "transformers", "sentence-transformers", "onnx")


@dataclass(frozen=True, slots=True)
class Artifact:
    """A built folder and what its builder recorded about the model in it."""

    folder: Path
    identity: dict[str, object]  # what it was built from; its hash names the folder
    meta: dict[str, object]  # kind, dimension, max_tokens, model config facts
    built: bool  # False: an earlier build was reused

    @property
    def key(self) -> str:
        return identity_hash(self.identity)


def exports_dir() -> Path:
    """Where artifacts go: beside imported models, under ``exports`` (read when called)."""
    return default_cache_dir() / "exports"


def library_versions(*names: str) -> dict[str, str]:
    """Installed versions, read from package metadata (no import, so no torch)."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def folder_digest(folder: Path) -> str:
    """One hash over every file of a model folder (relative paths and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if any(part.startswith(".") for part in rel.split("/")):
            continue  # caches and lock files, not model content
        digest.update(f"{rel}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def identity_hash(identity: Mapping[str, object]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def read_artifact(folder: Path) -> tuple[dict[str, object], dict[str, object]] | None:
    try:
        stamp = json.loads((folder / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict):
        return None
    identity, meta = stamp.get("identity"), stamp.get("meta")
    return (identity, meta) if isinstance(identity, dict) and isinstance(meta, dict) else None


def build_cached(
    stage: str,
    identity: dict[str, object],
    build: Callable[[Path], dict[str, object]],
    root: Path | None = None,
) -> Artifact:
    """The folder for ``identity``: reused when its stamp matches, else ``build(folder)``
    writes it (and returns its meta). A lock lets one process build while others wait."""
    out = (root or exports_dir()) / f"{stage}-{identity_hash(identity)[:24]}"

    def cached() -> Artifact | None:
        found = read_artifact(out)
        if found is None or found[0] != identity:
            return None
        return Artifact(out, identity, found[1], built=False)

    if (hit := cached()) is not None:
        return hit
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out):
        if (hit := cached()) is not None:
            return hit  # another process built it while this one waited
        start = time.perf_counter()
        meta: dict[str, object] = {}

        def run(partial: Path) -> None:
            partial.mkdir(parents=True)
            meta.update(build(partial))

        write_stamped(out, run, STAMP_FILE, {"identity": identity, "meta": meta})
        log.info("built %s in %.1f s: %s", stage, time.perf_counter() - start, out)
    return Artifact(out, identity, meta, built=True)


def onnx_export(spec: EncoderSpec, root: Path | None = None) -> Artifact:
    """The model's ONNX graph and tokenizer, exported on first use and reused after."""
    folder = spec.source.resolve()
    cross = spec.task == Task.RERANK
    identity: dict[str, object] = {
        "export": EXPORT_VERSION,
        "opset": OPSET,
        "model": folder_digest(folder),
        "kind": "cross-encoder" if cross else "bi-encoder",
        "pooling": None if cross else spec.pooling,
        "max_tokens": spec.max_tokens,  # the limit is the smaller of it and the model's
        "libraries": library_versions(*EXPORT_LIBRARIES),
    }
    return build_cached("onnx", identity, lambda out: _export(spec, cross, out), root)


def merged_export(
    spec: EncoderSpec, base: Artifact, name: str, folder: Path, root: Path | None = None
) -> Artifact:
    """The model with LoRA adapter ``name`` (``folder``) merged into its weights, exported
    as ``base`` was: a graph the runtimes derive and compile as they do the base's. Keyed by
    the base export, the adapter's files and the libraries (peft merges)."""
    if base.meta.get("kind") != "bi-encoder":
        raise AdapterInvalid(
            f"model {spec.name!r} takes no adapters: they are served for "
            "sentence-transformers embedding models"
        )
    identity: dict[str, object] = {
        "from": base.key,
        "adapter": folder_digest(folder),
        "libraries": library_versions(*EXPORT_LIBRARIES, "peft"),
    }
    adapter = (name, folder)
    return build_cached("onnx-lora", identity, lambda out: _export(spec, False, out, adapter), root)


def _export(
    spec: EncoderSpec, cross: bool, out: Path, adapter: tuple[str, Path] | None = None
) -> dict[str, object]:
    """Trace the model as the torch runtime loads it, with eager attention (the one form
    ONNX Runtime's attention fusion recognises), through the TorchScript exporter."""
    graph, tokenizer, config, dimension, max_tokens = _traceable(spec, cross, adapter)
    _trace(graph, tokenizer, out / GRAPH_FILE)
    tokenizer.save_pretrained(str(out / TOKENIZER_DIR))
    return {
        "kind": "cross-encoder" if cross else "bi-encoder",
        "dimension": dimension,
        "max_tokens": max_tokens,
        "model_type": getattr(config, "model_type", None),
        "num_attention_heads": getattr(config, "num_attention_heads", None),
        "hidden_size": getattr(config, "hidden_size", None),
    }


def _traceable(
    spec: EncoderSpec, cross: bool, adapter: tuple[str, Path] | None = None
) -> tuple[Any, Any, object, int | None, int]:
    """(graph module, tokenizer, model config, dimension, max tokens) as the torch runtime
    loads the model on the CPU, wrapped to take positional tensors; with ``adapter``
    (name, folder), its LoRA merged into the Transformer's weights."""
    import torch

    from embedder.tasks.embed.runtimes.lora import merged
    from embedder.tasks.embed.runtimes.torch_st import _bi_encoder, _cross_encoder

    pooled, logits = _wrappers()
    cpu = torch.device("cpu")
    kwargs: dict[str, object] = {"attn_implementation": "eager"}
    if cross:
        model, tokenizer, max_tokens = _cross_encoder(spec, cpu, kwargs)
        return logits(model), tokenizer, getattr(model, "config", None), None, max_tokens
    module, tokenizer, dimension, max_tokens = _bi_encoder(spec, cpu, kwargs)
    transformer: Any = next(iter(module.children()))
    if adapter is not None:
        transformer.model = merged(transformer.auto_model, *adapter, spec.name)
    config = getattr(transformer.auto_model, "config", None)
    return pooled(module), tokenizer, config, dimension, max_tokens


def _wrappers() -> tuple[Any, Any]:
    """The two modules tracing takes (torch is imported only where a graph is built)."""
    import torch

    class Pooled(torch.nn.Module):
        """A sentence-transformers stack called with positional tensors, as tracing wants."""

        def __init__(self, stack: torch.nn.Module) -> None:
            super().__init__()
            self.stack = stack

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            features = self.stack(dict(zip(INPUT_NAMES, inputs, strict=True)))
            pooled: torch.Tensor = features["sentence_embedding"]
            return pooled

    class Logits(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model
            # Models without token types (DistilBERT) do not take the argument.
            self.types = "token_type_ids" in inspect.signature(model.forward).parameters

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            features = dict(zip(INPUT_NAMES, inputs, strict=True))
            if not self.types:
                features.pop("token_type_ids")
            logits: torch.Tensor = self.model(**features).logits
            return logits

    return Pooled, Logits


def _trace(graph: Any, tokenizer: Any, path: Path) -> None:
    import torch

    sample = tokenizer(
        ["a short text", "a somewhat longer text, so that the batch is padded"],
        padding=True,
        return_tensors="pt",
    )
    if "token_type_ids" not in sample:
        sample["token_type_ids"] = torch.zeros_like(sample["input_ids"])
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    with warnings.catch_warnings(), torch.inference_mode():
        # The legacy exporter is chosen on purpose (see above); its tracer warnings are
        # about branches that are constant for an encoder (mask width equals sequence).
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph.eval(),
            tuple(sample[name] for name in INPUT_NAMES),
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=["output"],
            dynamic_axes={**axes, "output": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
