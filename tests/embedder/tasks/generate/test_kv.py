"""The KV batch's bookkeeping on a tiny random cache: rows join left-padded, leave, and
the columns no row uses are trimmed (the padding stays a prefix of every row); several
prompts prefilled in one padded forward equal each prefilled alone."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from embedder.tasks.generate.kv import KVBatch, prefill, prefill_many, rows_of
from embedder.tasks.generate.runtime import GenerationRuntime


def cache_of(length: int, value: float, layers: int = 2) -> DynamicCache:
    cache = DynamicCache()
    for layer in range(layers):
        kv = torch.full((1, 2, length, 4), value)
        cache.update(kv, kv.clone(), layer)
    return cache


def test_join_pads_left_and_keep_trims() -> None:
    batch = KVBatch()
    batch.join(cache_of(3, 1.0), [3])
    batch.join(cache_of(5, 2.0), [5])
    batch.join(cache_of(2, 3.0), [2])
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


def test_a_row_group_joins_at_once_and_keeps_its_padding_prefix() -> None:
    batch = KVBatch()
    batch.join(cache_of(2, 1.0), [2])
    group = cache_of(4, 2.0)  # two rows of width 4: lengths 4 and 3 (one padding column)
    layers: list[Any] = list(group.layers)
    for layer in layers:
        layer.keys = torch.cat([layer.keys, layer.keys])
        layer.values = torch.cat([layer.values, layer.values])
    batch.join(group, [4, 3])
    assert batch.lengths == [2, 4, 3] and batch.width == 4
    assert batch.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]]
    only = rows_of(cache_of(5, 1.0), [0], width=3)
    assert only.layers[0].keys is not None and only.layers[0].keys.shape == (1, 2, 3, 4)


def test_prompts_prefilled_together_equal_each_prefilled_alone(
    tiny_runtime: GenerationRuntime,
) -> None:
    model = tiny_runtime.model
    prompts = [list(range(5, 5 + n)) for n in (3, 9, 6)]
    cache, logits = prefill_many(model, prompts)
    for i, prompt in enumerate(prompts):
        own, alone = prefill(model, None, prompt, 0)
        assert torch.allclose(logits[i], alone, atol=1e-5)
        keys = cache.layers[1].keys
        assert keys is not None and own.layers[1].keys is not None
        assert torch.allclose(keys[i, :, -len(prompt) :], own.layers[1].keys[0], atol=1e-5)
        assert float(keys[i, :, : 9 - len(prompt)].abs().sum()) == 0.0  # padding zeroed
