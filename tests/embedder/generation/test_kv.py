"""The KV batch's bookkeeping on a tiny random cache: rows join left-padded, leave, and
the columns no row uses are trimmed (the padding stays a prefix of every row)."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from embedder.generation.kv import KVBatch


def cache_of(length: int, value: float, layers: int = 2) -> DynamicCache:
    cache = DynamicCache()
    for layer in range(layers):
        kv = torch.full((1, 2, length, 4), value)
        cache.update(kv, kv.clone(), layer)
    return cache


def test_join_pads_left_and_keep_trims() -> None:
    batch = KVBatch()
    batch.join(cache_of(3, 1.0), 3)
    batch.join(cache_of(5, 2.0), 5)
    batch.join(cache_of(2, 3.0), 2)
    assert batch.rows == 3 and batch.width == 5 and batch.lengths == [3, 5, 2]
    assert batch.mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    keys = batch.cache.layers[0].keys  # type: ignore[union-attr]
    assert keys is not None and keys.shape == (3, 2, 5, 4)
    assert float(keys[0, 0, 1, 0]) == 0.0 and float(keys[0, 0, 2, 0]) == 1.0
    batch.keep([2, 0])  # the longest leaves: two columns nobody uses go
    assert batch.lengths == [2, 3] and batch.width == 3
    assert batch.mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    keys = batch.cache.layers[1].keys  # type: ignore[union-attr]
    assert keys is not None and keys.shape == (2, 2, 3, 4)
    assert float(keys[0, 0, 1, 0]) == 3.0 and float(keys[1, 0, 0, 0]) == 1.0
    batch.keep([])
    assert batch.rows == 0 and batch.cache is None
