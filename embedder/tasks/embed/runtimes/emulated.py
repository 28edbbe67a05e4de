"""The emulated device: a model folder's real tokenizer and dimension, no model.

``forward`` returns deterministic vectors (a pure function of each input's ids) at no
cost, or after a calibrated sleep per forward pass, so the host path alone (gateway,
queue, worker: decoding, tokenizing, encoding replies) can be measured apart from any
model: ``bench.hostpath`` asks how many tokens per second the host could feed a device.
The sleep releases the GIL as a device's kernels do.

Passes are cut as the torch runtime cuts them (``micro_batches`` with the profile's
``forward_tokens`` and ``forward_max_sequences``). One forward (one batch) sleeps once,
for the cost a measured runtime's fit gives it (``bench.cluster.calibrate`` fits the line
to real batch timings; ``bench.cluster.emulation`` turns a fit into these settings)::

    sleep_s = slowdown * (fixed + per padded token * padded tokens + per sequence * rows)

read from the worker's environment: ``FLOTILLA_EMULATED_FIXED_MS`` (per forward, default
0), ``FLOTILLA_EMULATED_MS_PER_1K_TOKENS`` (per 1,000 padded tokens, rows × longest row of
each pass, default 0: 1.0 emulates a device that runs 1M padded tokens/s),
``FLOTILLA_EMULATED_MS_PER_SEQUENCE`` (default 0) and ``FLOTILLA_EMULATED_SLOWDOWN``
(default 1: 3 emulates a device three times slower, two or three generations old).

This module imports neither torch nor sentence-transformers; a folder with a
``tokenizer.json`` is tokenized through ``tokenizers`` alone (``file_tokenizer``), so a
worker on the emulated device never imports ``transformers`` (which imports torch).
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

from embedder.core.errors import AdapterInvalid
from embedder.core.fleet import DeviceKind
from embedder.core.jobs import Task
from embedder.tasks.embed.batching import micro_batches
from embedder.tasks.embed.runtimes import Encoded, RuntimeInfo
from embedder.tasks.embed.runtimes.file_tokenizer import FileTokenizer, has_file_tokenizer
from embedder.tasks.embed.runtimes.tokenizing import Tokenizing
from embedder.tasks.embed.spec import EncoderSpec

MS_PER_1K_TOKENS_ENV = "FLOTILLA_EMULATED_MS_PER_1K_TOKENS"
FIXED_MS_ENV = "FLOTILLA_EMULATED_FIXED_MS"
MS_PER_SEQUENCE_ENV = "FLOTILLA_EMULATED_MS_PER_SEQUENCE"
SLOWDOWN_ENV = "FLOTILLA_EMULATED_SLOWDOWN"
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
        spec: EncoderSpec,
        tokenizer: object,
        *,
        dimension: int | None,
        max_tokens: int,
        forward_tokens: int,
        forward_max_sequences: int,
        ms_per_1k_tokens: float = 0.0,
        fixed_ms: float = 0.0,
        ms_per_sequence: float = 0.0,
        slowdown: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        for name, value in ((MS_PER_1K_TOKENS_ENV, ms_per_1k_tokens), (FIXED_MS_ENV, fixed_ms),
                            (MS_PER_SEQUENCE_ENV, ms_per_sequence)):  # fmt: skip
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if slowdown <= 0:
            raise ValueError(f"{SLOWDOWN_ENV} must be > 0, got {slowdown}")
        self.spec = spec
        self.tokenizer = tokenizer
        self.dimension = dimension
        self.max_tokens = max_tokens
        self.forward_tokens = forward_tokens
        self.forward_max_sequences = forward_max_sequences
        self.ms_per_1k_tokens = ms_per_1k_tokens
        self.fixed_ms = fixed_ms
        self.ms_per_sequence = ms_per_sequence
        self.slowdown = slowdown
        self.sleep = sleep
        self.last_passes: list[tuple[int, int]] = []  # (rows, padded width) of the last forward
        width = 1 if dimension is None else dimension
        rng = np.random.default_rng(0)
        self._tables = rng.standard_normal((2, _TABLE_ROWS, width)).astype(np.float32)
        self.info = RuntimeInfo(
            kind="bi-encoder" if dimension is not None else "cross-encoder",
            device="emulated",
            dtype=f"emulated ({fixed_ms:g} ms + {ms_per_1k_tokens:g} ms per 1k padded tokens"
            f" + {ms_per_sequence:g} ms per sequence, x{slowdown:g})",
            dimension=dimension,
            max_tokens=max_tokens,
        )

    def forward(
        self, encoded: Encoded, adapters: Sequence[str | None] | None = None
    ) -> NDArray[np.float32]:
        lengths = [len(ids) for ids in encoded.ids]
        passes = micro_batches(lengths, self.forward_tokens, self.forward_max_sequences)
        self.last_passes = [(len(rows), max(lengths[i] for i in rows)) for rows in passes]
        seconds = self.cost_s(self.last_passes)
        if seconds > 0:
            self.sleep(seconds)  # once per batch: many short sleeps would each overshoot
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

    def cost_s(self, passes: Sequence[tuple[int, int]]) -> float:
        """What one forward of these (rows, padded width) passes costs on this device."""
        if not passes:
            return 0.0
        padded = sum(rows * width for rows, width in passes)
        rows = sum(r for r, _ in passes)
        ms = self.fixed_ms + padded * self.ms_per_1k_tokens / 1e3 + rows * self.ms_per_sequence
        return self.slowdown * ms / 1e3

    def prepare_adapter(self, name: str, folder: Path) -> None:
        pass  # load_adapter refuses, at the first request

    def load_adapter(self, name: str, folder: Path) -> None:
        raise AdapterInvalid(
            f"the emulated device serves no adapters: serve {self.spec.name!r} on a real "
            f"runtime to use adapter {name!r}"
        )

    def unload_adapter(self, name: str) -> None:
        return None


def load(spec: EncoderSpec, device_kind: DeviceKind, threads: int) -> EmulatedRuntime:
    folder = spec.source.resolve()
    tokenizer: object
    if has_file_tokenizer(folder):
        tokenizer = FileTokenizer(folder)
    else:  # a slow (Python) tokenizer only transformers builds
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tokenizer is local; never a hub
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    profile = spec.profile(device_kind)
    return EmulatedRuntime(
        spec,
        tokenizer,
        dimension=None if spec.task == Task.RERANK else folder_dimension(folder),
        max_tokens=min(spec.max_tokens, folder_window(folder, tokenizer)),
        forward_tokens=profile.forward_tokens,
        forward_max_sequences=profile.forward_max_sequences,
        ms_per_1k_tokens=_env_ms(MS_PER_1K_TOKENS_ENV, 0.0),
        fixed_ms=_env_ms(FIXED_MS_ENV, 0.0),
        ms_per_sequence=_env_ms(MS_PER_SEQUENCE_ENV, 0.0),
        slowdown=_env_ms(SLOWDOWN_ENV, 1.0),
    )


def _env_ms(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
