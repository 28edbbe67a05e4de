"""The emulated device: a model folder's real tokenizer and dimension, no model.

``forward`` returns deterministic vectors (a pure function of each input's ids) at no
cost, or after a calibrated sleep per forward pass, so the host path alone (gateway,
queue, worker: decoding, tokenizing, encoding replies) can be measured apart from any
model: ``bench.hostpath`` asks how many tokens per second the host could feed a device.
The sleep releases the GIL as a device's kernels do.

Passes are cut as the torch runtime cuts them (``micro_batches`` with the profile's
``forward_tokens`` and ``forward_max_sequences``); each pass sleeps for its padded
tokens (rows × longest row) at ``FLOTILLA_EMULATED_MS_PER_1K_TOKENS`` milliseconds per
1,000 (default 0): 1.0 emulates a device that runs 1M padded tokens/s.

This module imports neither torch nor sentence-transformers (``transformers`` may import
torch itself when it is installed).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from embedder.batching import micro_batches
from embedder.errors import AdapterInvalid
from embedder.fleet import DeviceKind, ModelSpec
from embedder.jobs import Task
from embedder.runtimes import Encoded, RuntimeInfo
from embedder.runtimes.tokenizing import Tokenizing

MS_PER_1K_TOKENS_ENV = "FLOTILLA_EMULATED_MS_PER_1K_TOKENS"
_TABLE_ROWS = 4096  # two tables of this many rows: 16M distinct vectors


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def folder_dimension(folder: Path) -> int:
    """What the folder's model outputs: the last Dense layer's width, else the pooling
    width (sentence-transformers 2–5 and 6 name it differently), else ``hidden_size``."""
    listing = folder / "modules.json"
    modules = json.loads(listing.read_text(encoding="utf-8")) if listing.is_file() else []
    dimension: int | None = None
    for module in modules:
        config = _read_json(folder / module.get("path", "") / "config.json")
        kind = str(module.get("type", ""))
        if kind.endswith("Dense") and "out_features" in config:
            dimension = int(config["out_features"])
        elif kind.endswith("Pooling"):
            width = config.get("embedding_dimension", config.get("word_embedding_dimension"))
            dimension = int(width) if width is not None else dimension
    if dimension is None:
        dimension = int(_read_json(folder / "config.json")["hidden_size"])
    return dimension


def folder_window(folder: Path, tokenizer: Any) -> int:
    """The longest input the folder's model takes, as sentence-transformers reads it:
    ``max_seq_length`` when its config says, else the tokenizer's own limit, never past
    the model's position embeddings."""
    window = _read_json(folder / "sentence_bert_config.json").get("max_seq_length")
    if window is None:
        window = int(getattr(tokenizer, "model_max_length", 512))
    positions = _read_json(folder / "config.json").get("max_position_embeddings")
    return min(int(window), int(positions)) if positions else int(window)


class EmulatedRuntime(Tokenizing):
    """Tokenizes for real; forwards for free or for a calibrated sleep."""

    def __init__(
        self,
        spec: ModelSpec,
        tokenizer: object,
        *,
        dimension: int | None,
        max_tokens: int,
        forward_tokens: int,
        forward_max_sequences: int,
        ms_per_1k_tokens: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if ms_per_1k_tokens < 0:
            raise ValueError(f"{MS_PER_1K_TOKENS_ENV} must be >= 0, got {ms_per_1k_tokens}")
        self.spec = spec
        self.tokenizer = tokenizer
        self.dimension = dimension
        self.max_tokens = max_tokens
        self.forward_tokens = forward_tokens
        self.forward_max_sequences = forward_max_sequences
        self.ms_per_1k_tokens = ms_per_1k_tokens
        self.sleep = sleep
        self.last_passes: list[tuple[int, int]] = []  # (rows, padded width) of the last forward
        width = 1 if dimension is None else dimension
        rng = np.random.default_rng(0)
        self._tables = rng.standard_normal((2, _TABLE_ROWS, width)).astype(np.float32)
        self.info = RuntimeInfo(
            kind="bi-encoder" if dimension is not None else "cross-encoder",
            device="emulated",
            dtype=f"emulated ({ms_per_1k_tokens:g} ms per 1k padded tokens)",
            dimension=dimension,
            max_tokens=max_tokens,
        )

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> NDArray[np.float32]:
        lengths = [len(ids) for ids in encoded.ids]
        passes = micro_batches(lengths, self.forward_tokens, self.forward_max_sequences)
        self.last_passes = [(len(rows), max(lengths[i] for i in rows)) for rows in passes]
        for rows, width in self.last_passes:
            if self.ms_per_1k_tokens:
                self.sleep(rows * width * self.ms_per_1k_tokens / 1e6)
        # hash() of a tuple of ints does not depend on PYTHONHASHSEED: the same ids give
        # the same vector in every process.
        keys = np.fromiter(
            (hash(tuple(ids)) & 0xFFFFFFFF for ids in encoded.ids),
            dtype=np.uint64,
            count=len(encoded),
        )
        out: NDArray[np.float32] = (
            self._tables[0][keys % _TABLE_ROWS] + self._tables[1][(keys >> 12) % _TABLE_ROWS]
        )
        return out if self.dimension is not None else out[:, 0].copy()

    def load_adapter(self, name: str, folder: Path) -> None:
        raise AdapterInvalid(
            f"the emulated device serves no adapters: serve {self.spec.name!r} on a real "
            f"runtime to use adapter {name!r}"
        )

    def unload_adapter(self, name: str) -> None:
        return None


def load(spec: ModelSpec, device_kind: DeviceKind, threads: int) -> EmulatedRuntime:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tokenizer is local; never reach a hub
    from transformers import AutoTokenizer

    folder = spec.source.resolve()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    raw = os.environ.get(MS_PER_1K_TOKENS_ENV, "0")
    try:
        ms_per_1k = float(raw)
    except ValueError:
        raise ValueError(f"{MS_PER_1K_TOKENS_ENV} must be a number, got {raw!r}") from None
    profile = spec.profile(device_kind)
    return EmulatedRuntime(
        spec,
        tokenizer,
        dimension=None if spec.task is Task.RERANK else folder_dimension(folder),
        max_tokens=min(spec.max_tokens, folder_window(folder, tokenizer)),
        forward_tokens=profile.forward_tokens,
        forward_max_sequences=profile.forward_max_sequences,
        ms_per_1k_tokens=ms_per_1k,
    )
