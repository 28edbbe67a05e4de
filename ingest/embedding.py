"""Ingest embeds through the same work queue and workers as online requests.

Each document (or passage of one) becomes one RAW_VECTORS job with a long deadline:
the worker's earliest-deadline-first batching serves online requests (short
deadlines) first and fills the rest of each batch with documents. One job per
passage keeps a bad one's error its own.

``model_windows`` tells the chunking (``ingest.chunking``) how each loaded model counts
a document: with the model's own tokenizer and document prompt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from embedder.tasks.embed.codecs import decode_raw_vectors, raw_vectors_body
from embedder.core.errors import FlotillaError
from embedder.tasks.embed.execute import LoadedModel
from embedder.core.fleet import PromptUse
from embedder.core.jobs import ApiShape, Job, split_model
from embedder.queue import WorkQueue
from embedder.tasks.embed.runtimes import Runtime
from ingest.chunking import TokenWindow

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

    def _job(self, model: str, text: str, now: float, use: PromptUse) -> Job:
        base, adapter = split_model(model)  # "base:adapter" embeds with that adapter
        return Job.new(
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


def token_window(runtime: Runtime, prefix: str) -> TokenWindow:
    """The window of a loaded model whose documents get ``prefix`` (its document prompt).

    A runtime with a Hugging Face fast tokenizer is counted with a private copy of it:
    the worker's thread sets truncation on the shared one for over-long inputs, and a
    call from another thread meanwhile fails ("Already borrowed"). The copy counts
    what the worker's ``tokenize`` counts: the same tokenizer over prompt + text, with
    special tokens. Other runtimes (the test fakes) are counted through ``tokenize``.
    """
    backend = getattr(getattr(runtime, "tokenizer", None), "backend_tokenizer", None)
    if backend is not None:
        from tokenizers import Tokenizer

        private = Tokenizer.from_str(backend.to_str())
        private.no_truncation()
        private.no_padding()

        def count(text: str) -> int:
            return len(private.encode(prefix + text, add_special_tokens=True))

    else:

        def count(text: str) -> int:
            return runtime.tokenize([text], "right", prefix).full_lengths[0]

    return TokenWindow(max_tokens=runtime.info.max_tokens, count=count)


def model_windows(loaded: dict[str, LoadedModel]) -> Callable[[str], TokenWindow | None]:
    """Windows of the models in ``loaded`` (a ModelHost's, filled as models load) by name;
    ``model:adapter`` counts as its base model. None for a model not loaded."""
    windows: dict[str, TokenWindow] = {}

    def window(model: str) -> TokenWindow | None:
        base, _ = split_model(model)
        if base not in windows:
            found = loaded.get(base)
            if found is None:
                return None
            prefix = found.spec.prompt_prefix(use="document")
            windows[base] = token_window(found.runtime, prefix)
        return windows[base]

    return window
