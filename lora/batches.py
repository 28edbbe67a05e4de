"""Batches for in-batch negatives: every other passage in a batch is a negative for a
query, so a batch must not hold the same query or passage twice ("Verjährung" heads
sections in several laws; two of them in one batch would teach the model that one
right answer is wrong). Pure: the order comes from the ``random.Random`` passed in.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from lora.dataset import Pair


def batches(pairs: Sequence[Pair], size: int, rng: random.Random) -> list[list[int]]:
    """Indices of ``pairs`` in shuffled batches of at most ``size`` with no repeated
    query or passage text. A pair that clashes waits for a later batch; a batch of one
    (no negatives) is dropped."""
    if size < 2:
        raise ValueError("in-batch negatives need batches of two or more")
    remaining = list(range(len(pairs)))
    rng.shuffle(remaining)
    out: list[list[int]] = []
    while remaining:
        batch: list[int] = []
        queries: set[str] = set()
        passages: set[str] = set()
        rest: list[int] = []
        for i in remaining:
            pair = pairs[i]
            if len(batch) < size and pair.query not in queries and pair.positive not in passages:
                batch.append(i)
                queries.add(pair.query)
                passages.add(pair.positive)
            else:
                rest.append(i)
        if len(batch) > 1:
            out.append(batch)
        remaining = rest
    return out
