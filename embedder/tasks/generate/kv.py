"""The running sequences' KV cache as one batch that sequences join and leave.

Rows are left-padded to a common width, with an attention mask over the padding and
each row's own position ids, so one decode step runs every sequence in one forward.
The invariant: in every row the padding is a prefix (the real tokens end at the right
edge), so the columns that are padding in *every* row are a prefix too, and leaving
trims them. Masked columns get exactly zero attention weight, so a row computes what it
would alone: the suite checks this token for token against ``model.generate``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def _left_mask(lengths: list[int]) -> torch.Tensor:
    """(rows, max length): 1 over each row's tokens, which end at the right edge."""
    width = max(lengths)
    return (torch.arange(width) >= width - torch.tensor(lengths).unsqueeze(1)).long()


def _pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``t`` padded with zeros on the left of ``dim`` up to ``width``."""
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    # F.pad lists (left, right) pairs from the last dimension backwards.
    pads = [0, 0] * (t.dim() - 1 - dim % t.dim()) + [missing, 0]
    return F.pad(t, pads)


class KVBatch:
    """The cache of the sequences in the running batch, row ``i`` for sequence ``i``."""

    def __init__(self) -> None:
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.lengths: list[int] = []  # real tokens per row: the next token's position

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    def join(self, cache: DynamicCache, lengths: list[int]) -> None:
        """Add prefilled sequences as the last rows: ``cache`` holds one row per entry of
        ``lengths``, each row left-padded to the cache's width (``prefill_many``), its
        padding already zeroed."""
        joining: list[Any] = list(cache.layers)
        own = int(joining[0].keys.shape[2])
        if self.cache is None or not self.lengths:
            self.cache, self.lengths = cache, list(lengths)
            self.mask = _pad_left(_left_mask(lengths), own, 1)
            return
        width = max(self.width, own)
        rows = _pad_left(_left_mask(lengths), width, 1)
        # Full-attention layers, each with keys and values (batch, heads, tokens, dim).
        layers: list[Any] = list(self.cache.layers)
        for mine, theirs in zip(layers, joining, strict=True):
            mine.keys = torch.cat(
                [_pad_left(mine.keys, width, 2), _pad_left(theirs.keys, width, 2)]
            )
            mine.values = torch.cat(
                [_pad_left(mine.values, width, 2), _pad_left(theirs.values, width, 2)]
            )
        self.mask = torch.cat([_pad_left(self.mask, width, 1), rows])
        self.lengths += lengths

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order); trim the columns no row uses any more."""
        if rows == list(range(self.rows)):
            return
        if not rows:
            self.__init__()  # type: ignore[misc]
            return
        assert self.cache is not None
        index = torch.tensor(rows)
        mask = self.mask[index]
        start = int(torch.nonzero(mask.sum(0))[0])  # the first column some row uses
        layers: list[Any] = list(self.cache.layers)
        for layer in layers:
            layer.keys = layer.keys[index, :, start:]
            layer.values = layer.values[index, :, start:]
        self.mask = mask[:, start:]
        self.lengths = [self.lengths[i] for i in rows]

    @torch.inference_mode()
    def step(self, model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
        """One decode step: each row's last token in, each row's next-token logits out
        (rows, vocab) in fp32; every row's cache grows by one."""
        assert self.cache is not None and len(tokens) == self.rows
        mask = torch.cat([self.mask, torch.ones(self.rows, 1, dtype=torch.long)], 1)
        out = model(
            input_ids=torch.tensor(tokens).unsqueeze(1),
            attention_mask=mask,
            position_ids=torch.tensor(self.lengths).unsqueeze(1),
            past_key_values=self.cache,
            use_cache=True,
        )
        self.mask = mask
        self.lengths = [n + 1 for n in self.lengths]
        logits: torch.Tensor = out.logits[:, -1].float()
        return logits


def rows_of(cache: DynamicCache, rows: list[int], width: int) -> DynamicCache:
    """The cache of only ``rows`` (a left-padded batch cache's rows, in that order),
    trimmed to the last ``width`` columns (their longest row)."""
    index = torch.tensor(rows)
    layers: list[Any] = list(cache.layers)
    for layer in layers:
        layer.keys = layer.keys[index, :, -width:]
        layer.values = layer.values[index, :, -width:]
    return cache


@torch.inference_mode()
def prefill(
    model: torch.nn.Module, cache: DynamicCache | None, ids: list[int], start: int
) -> tuple[DynamicCache, torch.Tensor]:
    """Run ``ids`` (a prompt's tokens from position ``start``) into a batch-of-one cache;
    the logits after its last token, fp32. A long prompt runs in several such chunks."""
    cache = cache if cache is not None else DynamicCache()
    out = model(
        input_ids=torch.tensor([ids]),
        attention_mask=torch.ones(1, start + len(ids), dtype=torch.long),
        position_ids=torch.arange(start, start + len(ids)).unsqueeze(0),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,  # the vocabulary projection of every prompt token is waste
    )
    logits: torch.Tensor = out.logits[0, -1].float()
    return cache, logits


@torch.inference_mode()
def prefill_many(
    model: torch.nn.Module, prompts: list[list[int]]
) -> tuple[DynamicCache, torch.Tensor]:
    """Whole prompts in one forward, left-padded to the longest: a cache with a row per
    prompt (ready for ``KVBatch.join``) and each prompt's next-token logits (rows, vocab)
    in fp32. On a CPU one forward over several short prompts makes more tokens/s than
    one forward each, and the last of a burst gets its first token sooner."""
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    mask = _left_mask(lengths)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    positions = (torch.arange(width) - (width - torch.tensor(lengths)).unsqueeze(1)).clamp(min=0)
    cache = DynamicCache()
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    # The padding's keys and values are masked everywhere; zero them so they stay inert
    # (and finite) in the running batch, as the padding ``join`` adds is.
    pad = (mask == 0)[:, None, :, None]
    layers: list[Any] = list(cache.layers)
    for layer in layers:
        layer.keys = layer.keys.masked_fill(pad, 0)
        layer.values = layer.values.masked_fill(pad, 0)
    logits: torch.Tensor = out.logits[:, -1].float()
    return cache, logits
