"""TEI's sentence similarity (``/similarity``) and its root (``/``), which takes an embed
body or a similarity one: huggingface_hub's ``InferenceClient`` posts both
``feature_extraction`` and ``sentence_similarity`` to a server's root.

A similarity request embeds the source sentence and the others with the same prompt
(a symmetric comparison) and answers each other sentence's cosine to the source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from embedder.tasks.embed.bodies import SimilarityInput, SimilarityParameters, TeiRoot, TeiSimilarity
from embedder.tasks.embed.codecs import (
    EmbedRequest,
    RequestLimits,
    _decode,
    _dimensions,
    _nonblank,
    _texts,
    _use,
    json_with_vectors,
)


@dataclass(frozen=True, slots=True)
class SimilarityRequest(EmbedRequest):
    """``texts[0]`` is the source sentence, the rest are compared with it."""


def _similarity(
    inputs: SimilarityInput, params: SimilarityParameters, limits: RequestLimits
) -> SimilarityRequest:
    return SimilarityRequest(
        texts=[
            _nonblank(inputs.source_sentence, "'source_sentence'"),
            *_texts(inputs.sentences, "sentences", limits),
        ],
        normalize=True,
        truncate=limits.auto_truncate if params.truncate is None else params.truncate,
        side="left" if params.truncation_direction.lower() == "left" else "right",
        prompt_name=params.prompt_name,
    )


def decode_similarity(body: bytes, limits: RequestLimits) -> EmbedRequest:
    tei = _decode(body, TeiSimilarity)
    return _similarity(tei.inputs, tei.parameters or SimilarityParameters(), limits)


def decode_root(body: bytes, limits: RequestLimits) -> EmbedRequest:
    root = _decode(body, TeiRoot)
    if isinstance(root.inputs, SimilarityInput):
        params = root.parameters or SimilarityParameters(
            root.truncate, root.truncation_direction, root.prompt_name
        )
        return _similarity(root.inputs, params, limits)
    return EmbedRequest(  # as /embed decodes it
        texts=_texts(root.inputs, "inputs", limits),
        normalize=root.normalize,
        truncate=limits.auto_truncate if root.truncate is None else root.truncate,
        side="left" if root.truncation_direction.lower() == "left" else "right",
        dimensions=_dimensions(root.dimensions),
        prompt_name=root.prompt_name,
        use=_use(root.input_type),
    )


def encode(request: EmbedRequest, vectors: NDArray[np.float32]) -> bytes:
    """Cosines for a similarity request (its vectors are unit length), else the vectors."""
    if isinstance(request, SimilarityRequest):
        return json_with_vectors(np.ascontiguousarray(vectors[1:] @ vectors[0]))
    return json_with_vectors(vectors)
