"""Every API shape's codec, chosen by shape: the worker decodes and encodes through here.

``codecs`` holds the shared requests and the OpenAI, TEI and Cohere v1 shapes;
``similarity`` (TEI's root and /similarity) and ``cohere_v2`` build on it, and are
registered below rather than imported by it, so the imports run one way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

import embedder.tasks.embed.codecs as codecs
import embedder.tasks.embed.cohere_v2 as cohere_v2
import embedder.tasks.embed.similarity as similarity
from embedder.core.jobs import ApiShape
from embedder.tasks.embed.codecs import EmbedRequest, RequestLimits

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


def decode_embed(shape: ApiShape, body: bytes, limits: RequestLimits) -> EmbedRequest:
    decoder = EMBED_DECODERS.get(shape)
    return decoder(body, limits) if decoder else codecs.decode_embed(shape, body, limits)


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
