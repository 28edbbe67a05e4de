"""The fleet the benchmark serves: many entries made from the bundled embedding weights,
each a kind (weights × runtime × precision) under a name of its own, every one
``load: on_demand`` and evictable. Separate entries are separate resident copies, even of
one kind: that is what makes a fleet wider than memory out of two sets of weights.

Runtime and precision are written out (no ``dtype: auto``), so every load runs the same
code and no tune starts in the background; the server runs with ``--untuned defaults``."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from embedder.core.fleet import Fleet
from embedder.tasks.embed.spec import EncoderSpec

# The bundled fleet's embedding models, by the short name an entry's name starts with.
WEIGHTS = {"minilm": "all-minilm-l6-v2", "e5": "multilingual-e5-small"}
SHORT_DTYPE = {"float32": "f32", "bfloat16": "bf16", "int8": "i8"}
# The package a runtime needs beyond torch: a kind whose runtime is not installed is left out.
RUNTIME_PACKAGE = {"torch": "torch", "onnx": "onnxruntime", "openvino": "openvino"}


@dataclass(frozen=True, slots=True)
class Kind:
    """Weights (a key of ``WEIGHTS``), runtime and precision: what one entry loads."""

    weights: str
    runtime: str
    dtype: str

    @property
    def tag(self) -> str:
        return f"{self.weights}-{self.runtime}-{SHORT_DTYPE.get(self.dtype, self.dtype)}"


# The order a fleet takes kinds in: small and quick to load first, so a short fleet is all
# MiniLM; then e5 (0.47 GB in fp32, seconds to load), then the rarer profiles.
KINDS = (
    Kind("minilm", "torch", "float32"),
    Kind("minilm", "torch", "bfloat16"),
    Kind("minilm", "onnx", "float32"),
    Kind("minilm", "openvino", "float32"),
    Kind("e5", "torch", "float32"),
    Kind("e5", "torch", "bfloat16"),
    Kind("minilm", "openvino", "bfloat16"),
    Kind("e5", "onnx", "float32"),
)
QUICK_KINDS = KINDS[:3]


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    kind: Kind


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def available(kinds: Sequence[Kind], has: Callable[[str], bool] = installed) -> list[Kind]:
    """The kinds whose runtime's package is installed here."""
    return [k for k in kinds if has(RUNTIME_PACKAGE.get(k.runtime, k.runtime))]


def entries(count: int, kinds: Sequence[Kind]) -> list[Entry]:
    """``count`` entries cycling over ``kinds``: the first round one of each, then second
    copies in the same order, and so on; names say kind and copy (``minilm-torch-f32-2``)."""
    if count < 1 or not kinds:
        raise ValueError("a fleet needs at least one entry and one kind")
    return [
        Entry(f"{kinds[i % len(kinds)].tag}-{i // len(kinds) + 1}", kinds[i % len(kinds)])
        for i in range(count)
    ]


def warmers(kinds: Sequence[Kind]) -> list[Entry]:
    """One entry per runtime of ``kinds`` (the runtime's first kind there), to load at
    start and pin: the runtime's libraries are in the process before the load, and what
    they hold is counted with a model that never leaves."""
    first: dict[str, Kind] = {}
    for kind in kinds:
        first.setdefault(kind.runtime, kind)
    return [Entry(f"warm-{kind.tag}", kind) for kind in first.values()]


def fleet_file(
    chosen: Sequence[Entry], bundled: Fleet, pinned: Sequence[Entry] = ()
) -> dict[str, Any]:
    """The fleet file's data: each entry as its bundled model (source, pooling, prompts)
    without its aliases and adapters (names must be unique; adapters are not measured),
    with its kind's runtime and precision on the CPU; ``chosen`` on demand and evictable,
    ``pinned`` (first) loaded at start and never evicted."""
    models: dict[str, Any] = {}
    for entry in [*pinned, *chosen]:
        at_start = entry in pinned
        base = bundled.get(WEIGHTS[entry.kind.weights])
        assert isinstance(base, EncoderSpec)
        raw = base.model_dump(
            mode="json",
            exclude={"name", "aliases", "adapters", "profiles", "load", "pin"},
            exclude_unset=True,
        )
        cpu = base.profile("cpu").model_dump(mode="json", exclude_unset=True)
        cpu.update(runtime=entry.kind.runtime, dtype=entry.kind.dtype)
        models[entry.name] = {
            **raw,
            "profiles": {"cpu": cpu},
            "load": "start" if at_start else "on_demand",
            "pin": at_start,
        }
    return {"models": models}
