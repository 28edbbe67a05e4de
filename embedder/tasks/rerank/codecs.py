"""Rerank requests in, ranked scores out, in each API's shape: TEI's ``/rerank``, Cohere's
``/v1/rerank`` and ``/v2/rerank`` (as the cohere SDK's ``ClientV2`` reads it). Texts are
checked the way the embedding codecs check them (``embedder.tasks.embed.codecs``).

Cohere v2 always cuts long documents to the window (``max_tokens_per_doc`` may not ask
for less) and every v2 answer carries ``meta`` with the API version and the tokens it took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec
import numpy as np
from numpy.typing import NDArray

import embedder.tasks.embed.cohere_v2 as cohere_v2
from embedder.core.errors import InvalidRequest
from embedder.core.jobs import ApiShape, TruncationSide
from embedder.tasks.embed.codecs import (
    RequestLimits,
    decode_body,
    input_texts,
    json_with_vectors,
    nonblank,
)


@dataclass(frozen=True, slots=True)
class RerankRequest:
    query: str
    documents: list[str]
    truncate: bool = False
    side: TruncationSide = "right"
    top_n: int | None = None
    return_documents: bool = False
    raw_scores: bool = False


@dataclass(frozen=True, slots=True)
class CohereRerankRequest(RerankRequest):
    max_tokens: int | None = None  # per document, as the request asks


# Bodies as sent. Unknown fields are ignored, as the reference servers do.


class TeiRerank(msgspec.Struct):
    query: str
    texts: list[str]
    truncate: bool | None = None
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    raw_scores: bool = False
    return_text: bool = False


class Document(msgspec.Struct):
    text: str


class CohereRerank(msgspec.Struct):
    query: str
    documents: list[str | Document]
    model: str | None = None
    top_n: int | None = None
    return_documents: bool = False


class CohereRerankV2(msgspec.Struct):
    query: str
    documents: list[str]
    model: str | None = None
    top_n: int | None = None
    max_tokens_per_doc: int | None = None


BODIES: dict[ApiShape, type[msgspec.Struct]] = {
    ApiShape.TEI_RERANK: TeiRerank,
    ApiShape.COHERE_RERANK: CohereRerank,
    ApiShape.COHERE_RERANK_V2: CohereRerankV2,
}


def decode(shape: ApiShape, body: bytes, limits: RequestLimits) -> RerankRequest:
    if shape is ApiShape.COHERE_RERANK_V2:
        return _decode_v2(body, limits)
    return _decode_v1(shape, body, limits)


def _decode_v1(shape: ApiShape, body: bytes, limits: RequestLimits) -> RerankRequest:
    if shape is ApiShape.TEI_RERANK:
        tei = decode_body(body, TeiRerank)
        return RerankRequest(
            query=nonblank(tei.query, "'query'"),
            documents=input_texts(tei.texts, "texts", limits),
            truncate=limits.auto_truncate if tei.truncate is None else tei.truncate,
            side="left" if tei.truncation_direction.lower() == "left" else "right",
            return_documents=tei.return_text,
            raw_scores=tei.raw_scores,
        )
    if shape is ApiShape.COHERE_RERANK:
        co = decode_body(body, CohereRerank)
        docs = [d if isinstance(d, str) else d.text for d in co.documents]
        if co.top_n is not None and co.top_n <= 0:
            raise InvalidRequest(f"'top_n' must be a positive integer, got {co.top_n}")
        return RerankRequest(
            query=nonblank(co.query, "'query'"),
            documents=input_texts(docs, "documents", limits),
            truncate=limits.auto_truncate,
            top_n=co.top_n,
            return_documents=co.return_documents,
        )
    raise InvalidRequest(f"{shape} is not a rerank request")


def _decode_v2(body: bytes, limits: RequestLimits) -> CohereRerankRequest:
    co = decode_body(body, CohereRerankV2)
    return CohereRerankRequest(
        query=nonblank(co.query, "'query'"),
        documents=input_texts(co.documents, "documents", limits),
        truncate=True,  # v2 cuts long documents to max_tokens_per_doc rather than refusing
        top_n=cohere_v2.positive(co.top_n, "top_n"),
        max_tokens=cohere_v2.positive(co.max_tokens_per_doc, "max_tokens_per_doc"),
    )


def check_window(request: RerankRequest, window: int) -> None:
    if isinstance(request, CohereRerankRequest):
        cohere_v2.check_cap(request.max_tokens, "max_tokens_per_doc", window)


def encode(
    shape: ApiShape,
    request: RerankRequest,
    scores: NDArray[np.float32],
    model: str,
    tokens: int,
    job_id: str,
) -> bytes:
    if shape is ApiShape.COHERE_RERANK_V2:
        return _encode_v2(request, scores, tokens, job_id)
    return _encode_v1(shape, request, scores, model, tokens, job_id)


def _encode_v1(
    shape: ApiShape,
    request: RerankRequest,
    scores: NDArray[np.float32],
    model: str,
    tokens: int,
    job_id: str,
) -> bytes:
    order = np.argsort(-scores, kind="stable")
    if shape is ApiShape.TEI_RERANK:
        return msgspec.json.encode(
            [
                {"index": int(i), "score": float(scores[i])}
                | ({"text": request.documents[i]} if request.return_documents else {})
                for i in order
            ]
        )
    if request.top_n is not None:
        order = order[: request.top_n]
    return msgspec.json.encode(
        {
            "id": job_id,
            "model": model,
            "results": [
                {"index": int(i), "relevance_score": float(scores[i])}
                | ({"document": {"text": request.documents[i]}} if request.return_documents else {})
                for i in order
            ],
            "usage": {"total_tokens": tokens},
        }
    )


def _encode_v2(
    request: RerankRequest, scores: NDArray[np.float32], tokens: int, job_id: str
) -> bytes:
    order = np.argsort(-scores, kind="stable")[: request.top_n]
    results = [{"index": int(i), "relevance_score": float(scores[i])} for i in order]
    return json_with_vectors({"id": job_id, "results": results, "meta": cohere_v2.meta(tokens)})
