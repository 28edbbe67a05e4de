"""Timing a runtime as the worker drives it: the calibration texts arrive in order, are
cut into batches of ``max_batch_tokens`` and each batch is one ``forward`` call (which
sorts and splits it into passes of the runtime's shape). Tokens counted are real ones,
padding excluded, so candidates that pad less are faster, as they are when serving."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter  # a name of this module: tests give it a fake clock

import numpy as np
from numpy.typing import NDArray

from embedder.tasks.embed.runtimes import Encoded, Runtime


@dataclass(frozen=True, slots=True)
class Workload:
    texts: Sequence[str]
    prefix: str = ""  # the model's document prompt, as ingested documents get it

    def encode(self, runtime: Runtime) -> Encoded:
        return runtime.tokenize(self.texts, "right", self.prefix)


def batches(encoded: Encoded, max_batch_tokens: int) -> list[Encoded]:
    """Consecutive inputs up to ``max_batch_tokens`` real tokens each (one input alone
    when it is longer), in arrival order, as the worker takes them from the queue."""
    out: list[Encoded] = []
    start, tokens = 0, 0
    for i, ids in enumerate(encoded.ids):
        if i > start and tokens + len(ids) > max_batch_tokens:
            out.append(_rows(encoded, start, i))
            start, tokens = i, 0
        tokens += len(ids)
    out.append(_rows(encoded, start, len(encoded.ids)))
    return out


def _rows(encoded: Encoded, start: int, stop: int) -> Encoded:
    return Encoded(
        ids=encoded.ids[start:stop],
        type_ids=encoded.type_ids[start:stop] if encoded.type_ids is not None else None,
        full_lengths=encoded.full_lengths[start:stop],
    )


def timed_pass(runtime: Runtime, parts: Sequence[Encoded]) -> tuple[float, NDArray[np.float32]]:
    """Seconds for one pass over ``parts`` and the outputs, in input order."""
    start = perf_counter()
    outputs = [runtime.forward(part) for part in parts]
    return perf_counter() - start, np.concatenate(outputs)
