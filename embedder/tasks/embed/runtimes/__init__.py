"""Runtimes run one model on one device. The protocol and registry are torch-free;
a runtime's module is imported only when a model that names it is loaded."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from embedder.core.fleet import DeviceKind, Precision
from embedder.core.jobs import TruncationSide
from embedder.tasks.embed.spec import EncoderSpec

# Every precision below fp32 keeps the worst cosine of its vectors to fp32's at least this
# high (on calibration texts): `dtype: auto` at load and the tuner refuse what falls below.
MIN_COSINE = 0.999


def worst_cosine(reference: NDArray[np.float32], vectors: NDArray[np.float32]) -> float:
    """The smallest row-wise cosine between two (n, dim) arrays of the same texts."""
    if reference.shape != vectors.shape:
        raise ValueError(f"outputs of shape {vectors.shape}, the reference's {reference.shape}")
    a = reference / np.maximum(np.linalg.norm(reference, axis=1, keepdims=True), 1e-12)
    b = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return float((a * b).sum(axis=1).min())


@dataclass(frozen=True, slots=True)
class Encoded:
    """Tokenized inputs: ids cut to the model's limit, and each input's full length."""

    ids: list[list[int]]
    type_ids: list[list[int]] | None
    full_lengths: list[int]

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.ids)

    @staticmethod
    def concat(parts: Sequence[Encoded]) -> Encoded:
        with_types = all(p.type_ids is not None for p in parts)
        return Encoded(
            ids=[ids for p in parts for ids in p.ids],
            type_ids=[t for p in parts for t in (p.type_ids or [])] if with_types else None,
            full_lengths=[n for p in parts for n in p.full_lengths],
        )


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    kind: Literal["bi-encoder", "cross-encoder"]
    device: str
    dtype: str
    dimension: int | None  # None for cross-encoders
    max_tokens: int


class Runtime(Protocol):
    info: RuntimeInfo

    def tokenize(self, texts: Sequence[str], side: TruncationSide, prefix: str = "") -> Encoded:
        """Bi-encoders: one text per input, each after ``prefix`` (a prompt such as e5's
        "query: "). The prefix's tokens count towards the limit, and truncation on
        either side keeps them: it cuts the text."""
        ...

    def tokenize_pairs(self, query: str, docs: Sequence[str], side: TruncationSide) -> Encoded:
        """Cross-encoders: (query, doc) pairs; truncation cuts the document."""
        ...

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> NDArray[np.float32]:
        """(n, dim) pooled, unnormalized vectors, or (n,) raw scores for cross-encoders.
        ``adapters[i]`` names the resident adapter for row i (None: the base model)."""
        ...

    def prepare_adapter(self, name: str, folder: Path) -> None:
        """Start, in the background, what makes a later ``load_adapter`` quick (an exported
        graph's build with the adapter merged); nothing where loading is quick already."""
        ...

    def load_adapter(self, name: str, folder: Path) -> None:
        """Make adapter ``name`` resident; AdapterInvalid if it does not fit, and
        AdapterBuilding while the runtime is still building what it needs for it."""
        ...

    def unload_adapter(self, name: str) -> None: ...


RuntimeFactory = Callable[[EncoderSpec, DeviceKind, int], Runtime]

# name -> "module:function"; imported lazily so the registry itself stays torch-free.
RUNTIMES: dict[str, str] = {
    "torch": "embedder.tasks.embed.runtimes.torch_st:load",
    "onnx": "embedder.tasks.embed.runtimes.onnx:load",
    "openvino": "embedder.tasks.embed.runtimes.openvino:load",
    "emulated": "embedder.tasks.embed.runtimes.emulated:load",
}

# name -> device kind -> the precisions it offers there: what `flotilla tune` tries. A
# runtime that registers above registers here too; one that cannot load on this machine
# (a missing package, a precision the CPU lacks) is skipped by the tuner with its reason.
PRECISIONS: dict[str, dict[DeviceKind, tuple[Precision, ...]]] = {
    "torch": {
        "cpu": ("float32", "bfloat16", "bfloat16-autocast"),
        "cuda": ("float32", "bfloat16", "float16"),
    },
    # No bf16 arithmetic on ONNX Runtime's CPU provider; dynamic int8 on the CPU only.
    "onnx": {"cpu": ("float32", "int8"), "cuda": ("float32",)},
    "openvino": {"cpu": ("float32", "bfloat16", "int8")},
    # "emulated" computes no model: nothing to tune.
}


# The libraries a runtime's loads share, imported once per process. The graph runtimes
# export their graphs from the torch model (once, then cached), so torch is theirs too.
LIBRARIES: dict[str, tuple[str, ...]] = {
    "torch": ("torch", "transformers", "sentence_transformers"),
    "onnx": ("onnxruntime", "torch", "transformers", "sentence_transformers"),
    "openvino": ("openvino", "torch", "transformers", "sentence_transformers"),
    "emulated": (),
}


def prepare_runtime(spec: EncoderSpec, device: DeviceKind) -> None:
    """Import the runtime ``spec`` names on ``device``, and the libraries it loads with."""
    name = spec.profile(device).runtime
    if name not in RUNTIMES:
        return  # load_runtime says what is wrong
    module = importlib.import_module(RUNTIMES[name].partition(":")[0])
    for library in LIBRARIES.get(name, ()):
        importlib.import_module(library)
    start = getattr(module, "prepare", None)  # what a runtime sets up once per process
    if start is not None:
        start(device)


def load_runtime(spec: EncoderSpec, device: DeviceKind, threads: int) -> Runtime:
    name = spec.profile(device).runtime
    try:
        target = RUNTIMES[name]
    except KeyError:
        raise ValueError(
            f"model {spec.name!r} names runtime {name!r}; known runtimes: {', '.join(RUNTIMES)}"
        ) from None
    module_name, _, attr = target.partition(":")
    factory: RuntimeFactory = getattr(importlib.import_module(module_name), attr)
    return factory(spec, device, threads)
