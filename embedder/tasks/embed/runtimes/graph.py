"""What the ONNX Runtime and OpenVINO runtimes share: an exported graph run in
length-sorted passes, as the torch runtime runs its module.

Each runtime compiles the graph its own way and hands over one function from padded
inputs to the graph's output; tokenizing (the shared mixin, from the tokenizer saved with
the export), pass shapes, padding, the cross-encoder's score and the refusals live here,
so both give the same ids, the same passes and the same errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from embedder.tasks.embed.batching import micro_batches
from embedder.core.errors import AdapterInvalid
from embedder.core.fleet import DeviceKind, FleetError, ModelSpec, Precision
from embedder.tasks.embed.runtimes import Encoded, RuntimeInfo
from embedder.tasks.embed.runtimes.export import TOKENIZER_DIR, Artifact
from embedder.tasks.embed.runtimes.tokenizing import Tokenizing

Feeds = dict[str, NDArray[np.int64]]
RunGraph = Callable[[Feeds], NDArray[np.float32]]


def load_tokenizer(export: Artifact) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(export.folder / TOKENIZER_DIR))


def chosen_precision(
    spec: ModelSpec,
    device: DeviceKind,
    runtime: str,
    supported: Mapping[str, object],
    refusals: Mapping[str, str],
) -> str:
    """The profile's precision ('auto': float32, since anything lower must pass the
    tuner's guard first), or a FleetError saying what to write instead."""
    wanted: Precision = spec.profile(device).dtype
    dtype = "float32" if wanted == "auto" else wanted
    if dtype not in supported:
        reason = refusals.get(dtype, "it has no such precision")
        raise FleetError(
            f"model {spec.name!r}: runtime {runtime!r} cannot run dtype {dtype!r} on "
            f"{device}: {reason}; use {' or '.join(supported)}, or runtime torch"
        )
    return dtype


def threads_for(spec: ModelSpec, device: DeviceKind, threads: int) -> int:
    """The profile's threads, else the worker's setting; 0 leaves the library's default."""
    return spec.profile(device).threads or threads


class GraphRuntime(Tokenizing):
    def __init__(
        self,
        spec: ModelSpec,
        export: Artifact,
        run: RunGraph,
        *,
        runtime: str,
        device: DeviceKind,
        dtype: str,
    ) -> None:
        self.spec = spec
        self.run = run
        self.runtime = runtime
        self.tokenizer = load_tokenizer(export)
        self.pad_id = int(getattr(self.tokenizer, "pad_token_id", 0) or 0)
        self.cross = export.meta["kind"] == "cross-encoder"
        limit = export.meta.get("max_tokens")
        self.max_tokens = limit if isinstance(limit, int) else spec.max_tokens
        dimension = export.meta.get("dimension")
        profile = spec.profile(device)
        self.forward_tokens = profile.forward_tokens
        self.forward_max_sequences = profile.forward_max_sequences
        self.info = RuntimeInfo(
            kind="cross-encoder" if self.cross else "bi-encoder",
            device=device,
            dtype=dtype,
            dimension=dimension if isinstance(dimension, int) else None,
            max_tokens=self.max_tokens,
        )

    def _feeds(self, encoded: Encoded, rows: list[int]) -> Feeds:
        width = max(len(encoded.ids[i]) for i in rows)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        types = np.zeros((len(rows), width), dtype=np.int64)
        for r, i in enumerate(rows):
            n = len(encoded.ids[i])
            ids[r, :n] = encoded.ids[i]
            mask[r, :n] = 1
            if encoded.type_ids is not None:
                types[r, :n] = encoded.type_ids[i]
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> NDArray[np.float32]:
        if adapters and any(a is not None for a in adapters):
            self.load_adapter(next(a for a in adapters if a is not None), Path())
        lengths = [len(x) for x in encoded.ids]
        passes = micro_batches(lengths, self.forward_tokens, self.forward_max_sequences)
        result: NDArray[np.float32] | None = None
        for rows in passes:
            out = np.asarray(self.run(self._feeds(encoded, rows)), dtype=np.float32)
            if self.cross:  # the torch runtime's score: the one logit, else the largest
                out = out[:, 0] if out.shape[-1] == 1 else out.max(axis=-1)
            if result is None:
                result = np.empty((len(encoded), *out.shape[1:]), dtype=np.float32)
            result[rows] = out
        assert result is not None, "forward needs at least one input"
        return result

    def load_adapter(self, name: str, folder: Path) -> None:
        raise AdapterInvalid(
            f"adapter {name!r}: model {self.spec.name!r} runs on runtime {self.runtime!r}, "
            "an exported graph that cannot take adapters; serve adapters with runtime torch "
            "(the profile's `runtime: torch`)"
        )

    def unload_adapter(self, name: str) -> None:
        pass  # nothing is ever resident
