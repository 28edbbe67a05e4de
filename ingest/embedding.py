"""Ingest embeds through the same work queue and workers as online requests.

Each document becomes one RAW_VECTORS job with a long deadline: the worker's
earliest-deadline-first batching serves online requests (short deadlines)
first and fills the rest of each batch with documents. One job per document
keeps a bad document's error (too long, say) its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from embedder.codecs import decode_raw_vectors, raw_vectors_body
from embedder.errors import FlotillaError
from embedder.fleet import PromptUse
from embedder.jobs import ApiShape, EmbedJob, split_model
from embedder.queue import WorkQueue

Embedding = NDArray[np.float32] | FlotillaError


class QueueEmbedder:
    def __init__(
        self,
        queue: WorkQueue,
        *,
        deadline_s: float = 600.0,
        bytes_per_token: float = 4.0,
        priority: int = 10,
        truncate: bool = False,
    ) -> None:
        self.queue = queue
        self.deadline_s = deadline_s
        self.bytes_per_token = bytes_per_token
        self.priority = priority
        self.truncate = truncate  # False: an over-long document is dead-lettered, not cut

    def _job(self, model: str, text: str, now: float, use: PromptUse) -> EmbedJob:
        base, adapter = split_model(model)  # "base:adapter" embeds with that adapter
        return EmbedJob.new(
            base,
            ApiShape.RAW_VECTORS,
            # A model with prompts puts the one for this use first (e5: "passage: ").
            raw_vectors_body([text], truncate=self.truncate, use=use),
            now=now,
            timeout_s=self.deadline_s,
            bytes_per_token=self.bytes_per_token,
            priority=self.priority,
            adapter=adapter,
        )

    async def embed(
        self, items: Sequence[tuple[str, str]], use: PromptUse = "document"
    ) -> list[Embedding]:
        """Vectors (unit length) for ``(model, text)`` pairs, or each one's error. The
        texts are documents unless ``use`` says they are queries (an evaluation's)."""
        now = time.time()
        futures = [await self.queue.put(self._job(model, text, now, use)) for model, text in items]
        results = await asyncio.gather(*futures, return_exceptions=True)
        out: list[Embedding] = []
        for result in results:
            if isinstance(result, FlotillaError):
                out.append(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                out.append(decode_raw_vectors(result.body, 1)[0])
        return out
