"""Compressed embeddings as Cohere's embedding types define them, from unit-length floats.

- ``int8``: scalar quantization with one fixed scale, ``round(127 * x)``: a unit
  vector's components lie in [-1, 1], so nothing clips, the same text gets the same
  codes in every request (no per-batch calibration), and int8 dot products stay
  proportional to the float ones. Real 384-dimension models keep a cosine of about
  0.999 to the float vector this way; a per-model calibrated range would keep more,
  but its codes would change whenever the calibration did.
- ``uint8``: the same codes shifted into 0..255 (``int8 + 128``).
- ``ubinary``: one bit per dimension, 1 where the value is positive, 8 dimensions per
  byte with the first in the most significant bit (``numpy.packbits``); a dimension
  count that is not a multiple of 8 pads the last byte with zero bits.
- ``binary``: the same bytes as signed int8 (``ubinary - 128``), so Hamming distances
  are unchanged.

Each is one numpy expression over the whole batch: no Python loop per value.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray

Quantized = Literal["int8", "uint8", "binary", "ubinary"]
QUANTIZED: tuple[Quantized, ...] = ("int8", "uint8", "binary", "ubinary")
INT8_SCALE = 127.0


def quantize(unit: NDArray[np.float32], kind: Quantized) -> NDArray[np.int8] | NDArray[np.uint8]:
    """``unit``: (n, dim) rows of length 1. Returns (n, dim) int8/uint8 codes, or
    (n, ceil(dim / 8)) packed bits."""
    if kind in ("int8", "uint8"):
        codes: NDArray[np.int8] = np.clip(np.rint(unit * INT8_SCALE), -128, 127).astype(np.int8)
        if kind == "int8":
            return codes
        shifted: NDArray[np.uint8] = (codes.astype(np.int16) + 128).astype(np.uint8)
        return shifted
    packed: NDArray[np.uint8] = np.packbits(unit > 0, axis=-1)
    if kind == "ubinary":
        return packed
    signed: NDArray[np.int8] = (packed.astype(np.int16) - 128).astype(np.int8)
    return signed
