"""Every API shape's codec, chosen by shape: the worker decodes and encodes through here.

``codecs`` holds the shared requests and the OpenAI, TEI and Cohere v1 shapes;
``similarity`` (TEI's root and /similarity) and ``cohere_v2`` build on it, and are
registered below rather than imported by it, so the imports run one way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from embedder.tasks.embed import cohere_v2
from embedder.tasks.embed import similarity
from embedder.tasks.embed import codecs
from embedder.tasks.embed.codecs import EmbedRequest, RequestLimits, RerankRequest
from embedder.core.jobs import ApiShape

EmbedEncoder = Callable[[EmbedRequest, NDArray[np.float32], int, str], bytes]


def _cohere_embed(
    request: EmbedRequest, vectors: NDArray[np.float32], tokens: int, job_id: str
) -> bytes:
    assert isinstance(request, cohere_v2.CohereEmbedRequest)  # what decode_embed made
    return cohere_v2.encode_embed(request, vectors, tokens, job_id)


def _similarity(
    request: EmbedRequest, vectors: NDArray[np.float32], tokens: int, job_id: str
) -> bytes:
    return similarity.encode(request, vectors)


EMBED_DECODERS: dict[ApiShape, Callable[[bytes, RequestLimits], EmbedRequest]] = {
    ApiShape.TEI_ROOT: similarity.decode_root,
    ApiShape.TEI_SIMILARITY: similarity.decode_similarity,
    ApiShape.COHERE_EMBED_V2: cohere_v2.decode_embed,
}
EMBED_ENCODERS: dict[ApiShape, EmbedEncoder] = {
    ApiShape.TEI_ROOT: _similarity,
    ApiShape.TEI_SIMILARITY: _similarity,
    ApiShape.COHERE_EMBED_V2: _cohere_embed,
}
RERANK_DECODERS: dict[ApiShape, Callable[[bytes, RequestLimits], RerankRequest]] = {
    ApiShape.COHERE_RERANK_V2: cohere_v2.decode_rerank,
}


def decode_embed(shape: ApiShape, body: bytes, limits: RequestLimits) -> EmbedRequest:
    decoder = EMBED_DECODERS.get(shape)
    return decoder(body, limits) if decoder else codecs.decode_embed(shape, body, limits)


def decode_rerank(shape: ApiShape, body: bytes, limits: RequestLimits) -> RerankRequest:
    decoder = RERANK_DECODERS.get(shape)
    return decoder(body, limits) if decoder else codecs.decode_rerank(shape, body, limits)


def encode_embed(
    shape: ApiShape,
    request: EmbedRequest,
    vectors: NDArray[np.float32],
    model: str,
    tokens: int,
    job_id: str,
) -> bytes:
    encoder = EMBED_ENCODERS.get(shape)
    if encoder is None:
        return codecs.encode_embed(shape, request, vectors, model, tokens)
    return encoder(request, vectors, tokens, job_id)


def encode_rerank(
    shape: ApiShape,
    request: RerankRequest,
    scores: NDArray[np.float32],
    model: str,
    tokens: int,
    job_id: str,
) -> bytes:
    if shape is ApiShape.COHERE_RERANK_V2:
        return cohere_v2.encode_rerank(request, scores, tokens, job_id)
    return codecs.encode_rerank(shape, request, scores, model, tokens, job_id)
