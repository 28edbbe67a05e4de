"""A rerank model's fleet entry: an encoder (``embedder.tasks.embed.spec``) loaded as a
cross-encoder, which scores (query, document) pairs."""

from __future__ import annotations

from typing import Literal

from embedder.tasks.embed.spec import EncoderSpec


class RerankSpec(EncoderSpec):
    task: Literal["rerank"] = "rerank"
