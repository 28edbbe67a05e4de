"""Cohere's compressed embedding types from unit vectors, checked against definitions the
test spells out value by value (no numpy packing), and for what they keep."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from embedder.tasks.embed.quantize import QUANTIZED, quantize


def unit_rows(n: int, dim: int, seed: int = 0) -> NDArray[np.float32]:
    rows = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def packed_by_hand(row: NDArray[np.float32]) -> list[int]:
    """Bit j of byte j // 8, most significant first, is 1 where row[j] > 0."""
    out = []
    for start in range(0, len(row), 8):
        byte = 0
        for j, value in enumerate(row[start : start + 8]):
            byte |= (1 if value > 0 else 0) << (7 - j)
        out.append(byte)
    return out


@pytest.mark.parametrize("dim", [8, 32, 384, 13])
def test_binary_and_ubinary_are_packed_sign_bits(dim: int) -> None:
    rows = unit_rows(5, dim)
    rows[0, 0] = 0.0  # zero is not positive: bit 0
    ubinary = quantize(rows, "ubinary")
    binary = quantize(rows, "binary")
    assert ubinary.dtype == np.uint8 and binary.dtype == np.int8
    assert ubinary.shape == binary.shape == (5, -(-dim // 8))
    for row, got in zip(rows, ubinary, strict=True):
        assert got.tolist() == packed_by_hand(row)
    np.testing.assert_array_equal(binary.astype(np.int16), ubinary.astype(np.int16) - 128)


def test_hamming_distance_is_the_same_in_binary_and_ubinary() -> None:
    rows = unit_rows(2, 64)
    u, s = quantize(rows, "ubinary"), quantize(rows, "binary")
    hamming_u = np.unpackbits(u[0] ^ u[1]).sum()
    hamming_s = np.unpackbits(s[0].view(np.uint8) ^ s[1].view(np.uint8)).sum()
    assert hamming_u == hamming_s == ((rows[0] > 0) != (rows[1] > 0)).sum()


def test_int8_and_uint8_scale_the_unit_vector() -> None:
    rows = unit_rows(50, 384)
    rows[0, :2] = [1.0, -1.0]  # the extremes a unit vector can reach
    int8 = quantize(rows, "int8")
    uint8 = quantize(rows, "uint8")
    assert int8.dtype == np.int8 and uint8.dtype == np.uint8
    assert int8.shape == uint8.shape == rows.shape
    assert int8[0, :2].tolist() == [127, -127]
    want = [[round(float(v) * 127) for v in row] for row in rows[1:3]]
    assert int8[1:3].tolist() == want
    np.testing.assert_array_equal(uint8.astype(np.int16), int8.astype(np.int16) + 128)
    # What the codes keep: the direction, to within rounding (the most lost at 384 dims).
    back = int8[1:].astype(np.float64)
    cos = (back * rows[1:]).sum(axis=1) / np.linalg.norm(back, axis=1)
    assert cos.min() > 0.998


def test_codes_do_not_depend_on_the_rest_of_the_batch() -> None:
    rows = unit_rows(6, 32)
    for kind in QUANTIZED:
        np.testing.assert_array_equal(quantize(rows[:1], kind)[0], quantize(rows, kind)[0])
