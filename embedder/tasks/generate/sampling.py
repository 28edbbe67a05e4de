"""Picking the next token: greedy at temperature 0, else temperature and nucleus (top_p)
sampling from a generator of the sequence's own, so a ``seed`` repeats its output
whatever else runs in the batch."""

from __future__ import annotations

import random

import torch


class Sampler:
    def __init__(self, temperature: float, top_p: float, seed: int | None) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.generator: torch.Generator | None = None
        if temperature > 0:
            self.generator = torch.Generator().manual_seed(
                seed if seed is not None else random.getrandbits(63)
            )

    def pick(self, logits: torch.Tensor) -> int:
        """The next token for one row of fp32 logits (vocab,)."""
        if self.generator is None:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always).
            outside = sorted_probs.cumsum(-1) - sorted_probs >= self.top_p
            sorted_probs[outside] = 0.0
            choice = torch.multinomial(sorted_probs, 1, generator=self.generator)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=self.generator))
