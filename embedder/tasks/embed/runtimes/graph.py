"""What the ONNX Runtime and OpenVINO runtimes share: an exported graph run in
length-sorted passes, as the torch runtime runs its module.

Each runtime compiles the graph its own way and hands over one function from padded
inputs to the graph's output; tokenizing (the shared mixin, from the tokenizer saved with
the export), pass shapes, padding, the cross-encoder's score and the refusals live here,
so both give the same ids, the same passes and the same errors. So do LoRA adapters:
each is a graph of its own, the adapter merged in, built in the background and compiled
by the runtime as the base graph was (``adapter_graphs``); a pass runs each adapter's rows
on its graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from embedder.core.errors import AdapterInvalid
from embedder.core.fleet import DeviceKind, FleetError, Precision
from embedder.tasks.embed.batching import micro_batches
from embedder.tasks.embed.runtimes import Encoded, RuntimeInfo
from embedder.tasks.embed.runtimes.adapter_graphs import AdapterGraphs
from embedder.tasks.embed.runtimes.export import TOKENIZER_DIR, Artifact, merged_export
from embedder.tasks.embed.runtimes.tokenizing import Tokenizing
from embedder.tasks.embed.spec import EncoderSpec

Feeds = dict[str, NDArray[np.int64]]
RunGraph = Callable[[Feeds], NDArray[np.float32]]


def load_tokenizer(export: Artifact) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(export.folder / TOKENIZER_DIR))


def chosen_precision(
    spec: EncoderSpec,
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


def threads_for(spec: EncoderSpec, device: DeviceKind, threads: int) -> int:
    """The profile's threads, else the worker's setting; 0 leaves the library's default."""
    return spec.profile(device).threads or threads


class GraphRuntime(Tokenizing):
    def __init__(
        self,
        spec: EncoderSpec,
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
        self.adapters: AdapterGraphs[RunGraph] | None = None  # see serve_adapters
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

    def serve_adapters(
        self,
        export: Artifact,
        graph_file: Callable[[Artifact], Path],
        compile_graph: Callable[[Path], RunGraph],
    ) -> None:
        """Serve LoRA adapters as graphs of their own: each merged into an export like
        ``export``, made the runtime's graph file by ``graph_file`` and compiled by
        ``compile_graph``, as the base graph was (``adapter_graphs``)."""

        def build(name: str, folder: Path) -> Path:
            return graph_file(merged_export(self.spec, export, name, folder))

        self.adapters = AdapterGraphs(self.spec.name, self.runtime, build, compile_graph)

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> NDArray[np.float32]:
        """Each adapter's rows through its own graph, the base rows through the base's;
        the output keeps the input's order."""
        groups: dict[str | None, list[int]] = {}
        for i, name in enumerate(adapters or [None] * len(encoded)):
            groups.setdefault(name, []).append(i)
        result: NDArray[np.float32] | None = None
        for name, rows in groups.items():
            run = self.run if name is None else self._adapters().runner(name)
            out = self._run_rows(encoded, rows, run)
            if result is None:
                result = np.empty((len(encoded), *out.shape[1:]), dtype=np.float32)
            result[rows] = out
        assert result is not None, "forward needs at least one input"
        return result

    def _run_rows(self, encoded: Encoded, rows: list[int], run: RunGraph) -> NDArray[np.float32]:
        """``rows`` of ``encoded`` in length-sorted passes, in the order given."""
        lengths = [len(encoded.ids[i]) for i in rows]
        passes = micro_batches(lengths, self.forward_tokens, self.forward_max_sequences)
        result: NDArray[np.float32] | None = None
        for positions in passes:
            feeds = self._feeds(encoded, [rows[p] for p in positions])
            out = np.asarray(run(feeds), dtype=np.float32)
            if self.cross:  # the torch runtime's score: the one logit, else the largest
                out = out[:, 0] if out.shape[-1] == 1 else out.max(axis=-1)
            if result is None:
                result = np.empty((len(rows), *out.shape[1:]), dtype=np.float32)
            result[positions] = out
        assert result is not None, "forward needs at least one input"
        return result

    def _adapters(self) -> AdapterGraphs[RunGraph]:
        if self.adapters is None or self.cross:
            raise AdapterInvalid(
                f"model {self.spec.name!r} takes no adapters: they are served for "
                "sentence-transformers embedding models"
            )
        return self.adapters

    def prepare_adapter(self, name: str, folder: Path) -> None:
        if self.adapters is not None and not self.cross:
            self.adapters.prepare(name, folder)

    def load_adapter(self, name: str, folder: Path) -> None:
        self._adapters().load(name, folder)

    def unload_adapter(self, name: str) -> None:
        if self.adapters is not None:
            self.adapters.unload(name)
