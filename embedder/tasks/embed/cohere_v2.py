"""Cohere's v2 API (``/v2/embed``, ``/v2/rerank``): its bodies decoded into the shared
requests, its responses encoded, as the cohere SDK's ``ClientV2`` reads them.

What differs from the other shapes: ``input_type`` names what the texts are for,
``truncate`` defaults to cutting the end (NONE refuses over-long inputs),
``embedding_types`` asks for several encodings of the same unit-length vectors at once
(``embedder.tasks.embed.quantize``), rerank always cuts long documents to the window, and every
answer carries ``meta`` with the API version and the tokens it took.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from embedder.tasks.embed.bodies import CohereEmbedV2, CohereInput, CohereRerankV2, EmbeddingType, TextContent
from embedder.tasks.embed.codecs import (
    EmbedRequest,
    RequestLimits,
    RerankRequest,
    _decode,
    _dimensions,
    _nonblank,
    _texts,
    base64_rows,
    json_with_vectors,
)
from embedder.core.errors import InvalidRequest
from embedder.core.fleet import PromptUse
from embedder.tasks.embed.quantize import QUANTIZED, quantize

# input_type -> the prompt use; classification and clustering take the model's default
# prompt (e5 and its kin ask for the query prompt there, and make it their default).
INPUT_TYPES: dict[str, PromptUse | None] = {
    "search_query": "query",
    "search_document": "document",
    "classification": None,
    "clustering": None,
}
API_VERSION = {"version": "2"}


@dataclass(frozen=True, slots=True)
class CohereEmbedRequest(EmbedRequest):
    embedding_types: tuple[EmbeddingType, ...] = ("float",)
    max_tokens: int | None = None  # per input, as the request asks


@dataclass(frozen=True, slots=True)
class CohereRerankRequest(RerankRequest):
    max_tokens: int | None = None  # per document, as the request asks


def _use(input_type: str | None) -> PromptUse | None:
    if input_type is None:
        return None
    if input_type == "image":
        raise InvalidRequest("input_type 'image' is not served: the fleet embeds text")
    try:
        return INPUT_TYPES[input_type]
    except KeyError:
        raise InvalidRequest(
            f"'input_type' is {input_type!r}; send one of {', '.join(map(repr, INPUT_TYPES))}"
        ) from None


def _input_text(i: int, item: CohereInput) -> str:
    """An input's text parts, joined by newlines, make its one text."""
    parts = [part.text for part in item.content if isinstance(part, TextContent)]
    if len(parts) != len(item.content):
        raise InvalidRequest(f"inputs[{i}] holds an image: the fleet embeds text only")
    if not parts:
        raise InvalidRequest(f"inputs[{i}] has no content: send at least one text part")
    return "\n".join(parts)


def _positive(value: int | None, field: str) -> int | None:
    if value is not None and value <= 0:
        raise InvalidRequest(f"'{field}' must be a positive integer, got {value}")
    return value


def decode_embed(body: bytes, limits: RequestLimits) -> CohereEmbedRequest:
    co = _decode(body, CohereEmbedV2)
    if co.images:
        raise InvalidRequest("'images' are not served: the fleet embeds text; send 'texts'")
    if (co.texts is None) == (co.inputs is None):
        raise InvalidRequest("send the texts in exactly one of 'texts' or 'inputs'")
    if co.texts is not None:
        texts = _texts(co.texts, "texts", limits)
    else:
        assert co.inputs is not None
        texts = _texts([_input_text(i, item) for i, item in enumerate(co.inputs)], "inputs", limits)
    if co.embedding_types is not None and not co.embedding_types:
        raise InvalidRequest("'embedding_types' is empty: name at least one, e.g. [\"float\"]")
    return CohereEmbedRequest(
        texts=texts,
        normalize=True,  # Cohere's vectors are unit length; the quantized types need it
        truncate=co.truncate != "NONE",
        side="left" if co.truncate == "START" else "right",
        dimensions=_dimensions(co.output_dimension),
        use=_use(co.input_type),
        embedding_types=tuple(dict.fromkeys(co.embedding_types or ["float"])),
        max_tokens=_positive(co.max_tokens, "max_tokens"),
    )


def decode_rerank(body: bytes, limits: RequestLimits) -> CohereRerankRequest:
    co = _decode(body, CohereRerankV2)
    return CohereRerankRequest(
        query=_nonblank(co.query, "'query'"),
        documents=_texts(co.documents, "documents", limits),
        truncate=True,  # v2 cuts long documents to max_tokens_per_doc rather than refusing
        top_n=_positive(co.top_n, "top_n"),
        max_tokens=_positive(co.max_tokens_per_doc, "max_tokens_per_doc"),
    )


def check_window(request: EmbedRequest | RerankRequest, window: int) -> None:
    """Inputs are cut at the model's window; a smaller per-request cap cannot be kept."""
    if not isinstance(request, CohereEmbedRequest | CohereRerankRequest):
        return
    cap = request.max_tokens
    if cap is not None and cap < window:
        field = "max_tokens" if isinstance(request, CohereEmbedRequest) else "max_tokens_per_doc"
        raise InvalidRequest(
            f"'{field}' is {cap}, below this model's window of {window} tokens, where inputs "
            f"are cut: leave '{field}' out or send at least {window}"
        )


def _meta(tokens: int) -> dict[str, object]:
    return {"api_version": API_VERSION, "billed_units": {"input_tokens": tokens}}


def encode_embed(
    request: CohereEmbedRequest, vectors: NDArray[np.float32], tokens: int, job_id: str
) -> bytes:
    embeddings: dict[str, object] = {}
    for kind in request.embedding_types:
        if kind == "float":
            embeddings[kind] = vectors
        elif kind == "base64":
            embeddings[kind] = base64_rows(vectors)
        else:
            assert kind in QUANTIZED
            embeddings[kind] = quantize(vectors, kind)
    return json_with_vectors(
        {
            "id": job_id,
            "embeddings": embeddings,
            "texts": request.texts,
            "meta": _meta(tokens),
            "response_type": "embeddings_by_type",
        }
    )


def encode_rerank(
    request: RerankRequest, scores: NDArray[np.float32], tokens: int, job_id: str
) -> bytes:
    order = np.argsort(-scores, kind="stable")[: request.top_n]
    results = [{"index": int(i), "relevance_score": float(scores[i])} for i in order]
    return json_with_vectors({"id": job_id, "results": results, "meta": _meta(tokens)})
