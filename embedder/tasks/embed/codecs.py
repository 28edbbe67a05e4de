"""Wire formats: decode a raw request body, encode the finished response.

Each API shape (OpenAI, TEI, Cohere/Jina) has one codec. Workers call them,
so the gateway never parses inputs or serializes vectors.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Literal, TypeVar

import msgspec
import numpy as np
import orjson
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from embedder.core.errors import InvalidRequest, LimitExceeded
from embedder.core.fleet import PromptUse
from embedder.core.jobs import ApiShape, TruncationSide
from embedder.core.rawjson import check_depth, decode_struct

_B = TypeVar("_B", bound=msgspec.Struct)


class RequestLimits(BaseModel):
    """How requests are decoded where the models run. ``flotilla.settings`` holds it as
    its ``requests`` section: each field is a setting, named by its alias if it has one."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True)

    max_inputs: int = Field(
        default=512,
        gt=0,
        validation_alias="max_inputs_per_request",
        description="Most inputs or documents in one request (413 above); checked where the "
        "models run (`serve`, `worker`).",
    )
    auto_truncate: bool = Field(
        default=False,
        description="Cut over-long inputs to the model's limit instead of refusing them: "
        "requests that do not say (OpenAI and Cohere shapes) get vectors instead of a 413, "
        "ingested documents are cut instead of dead-lettered. Applied where the models run.",
    )


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    texts: list[str]
    normalize: bool | None = None  # None: the model's default
    truncate: bool = False
    side: TruncationSide = "right"
    dimensions: int | None = None
    encoding: Literal["float", "base64"] = "float"
    prompt_name: str | None = None  # one of the model's prompts, by name (TEI)
    use: PromptUse | None = None  # what the texts are for (input_type); picks the prompt


# Bodies as sent. Unknown fields are ignored, as the reference servers do.


class OpenAIEmbeddings(msgspec.Struct):
    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    input_type: str | None = None  # as Cohere and Voyage name it; see INPUT_TYPES


class _TokenIds(msgspec.Struct):
    """An OpenAI body whose input is token ids (one list, or one per input)."""

    input: list[int | list[int]]


TOKEN_IDS = (
    "'input' holds token ids, but flotilla tokenizes for itself: send the texts as strings. "
    "LangChain's OpenAIEmbeddings sends token ids unless told not to: create it with "
    "OpenAIEmbeddings(..., check_embedding_ctx_length=False)"
)


class TeiEmbed(msgspec.Struct):
    inputs: str | list[str]
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    dimensions: int | None = None
    prompt_name: str | None = None
    input_type: str | None = None  # beyond TEI: ingest and search send it on RAW_VECTORS


def decode_body(body: bytes, kind: type[_B]) -> _B:
    check_depth(body)  # the gateway checked already; a job may come from any queue
    return decode_struct(body, kind)


def _holds_token_ids(body: bytes) -> bool:
    try:
        msgspec.json.decode(body, type=_TokenIds)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return False
    return True


def _decode_openai(body: bytes) -> OpenAIEmbeddings:
    try:
        return decode_body(body, OpenAIEmbeddings)
    except InvalidRequest:
        if not _holds_token_ids(body):  # looked at only when the body failed
            raise
        raise InvalidRequest(TOKEN_IDS) from None


def input_texts(value: str | list[str], field: str, limits: RequestLimits) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise InvalidRequest(f"'{field}' must not be empty")
    if len(texts) > limits.max_inputs:
        raise LimitExceeded(
            f"'{field}' has {len(texts)} items, over the limit of {limits.max_inputs} per "
            "request: split the request, or raise --max-inputs-per-request "
            "(FLOTILLA_MAX_INPUTS_PER_REQUEST)"
        )
    for i, text in enumerate(texts):
        if not text.strip():
            nonblank(text, f"'{field}'" if isinstance(value, str) else f"'{field}' item {i}")
    return texts


def nonblank(text: str, what: str) -> str:
    """An empty or whitespace-only text has nothing to embed or score: a 422 that names it,
    rather than the vector of the special tokens alone."""
    if not text.strip():
        raise InvalidRequest(f"{what} is empty or only whitespace: send text, or leave it out")
    return text


# input_type values -> the use they ask for: Voyage's and Cohere's names, and e5's own.
INPUT_TYPES: dict[str, PromptUse] = {
    "query": "query",
    "search_query": "query",
    "document": "document",
    "passage": "document",
    "search_document": "document",
}


def _use(input_type: str | None) -> PromptUse | None:
    if input_type is None:
        return None
    try:
        return INPUT_TYPES[input_type]
    except KeyError:
        raise InvalidRequest(
            f"'input_type' is {input_type!r}; send one of {', '.join(map(repr, INPUT_TYPES))} "
            "or leave it out"
        ) from None


def _dimensions(value: int | None) -> int | None:
    if value is not None and value <= 0:
        raise InvalidRequest(f"'dimensions' must be a positive integer, got {value}")
    return value


def decode_embed(shape: ApiShape, body: bytes, limits: RequestLimits) -> EmbedRequest:
    if shape is ApiShape.OPENAI_EMBEDDINGS:
        oa = _decode_openai(body)
        return EmbedRequest(
            texts=input_texts(oa.input, "input", limits),
            truncate=limits.auto_truncate,
            dimensions=_dimensions(oa.dimensions),
            encoding=oa.encoding_format,
            use=_use(oa.input_type),
        )
    if shape in (ApiShape.TEI_EMBED, ApiShape.RAW_VECTORS):
        tei = decode_body(body, TeiEmbed)
        return EmbedRequest(
            texts=input_texts(tei.inputs, "inputs", limits),
            normalize=tei.normalize,
            truncate=limits.auto_truncate if tei.truncate is None else tei.truncate,
            side="left" if tei.truncation_direction.lower() == "left" else "right",
            dimensions=_dimensions(tei.dimensions),
            prompt_name=tei.prompt_name,
            use=_use(tei.input_type),
        )
    raise InvalidRequest(f"{shape} is not an embedding request")


def shape_vectors(
    vectors: NDArray[np.float32], request: EmbedRequest, model_normalizes: bool
) -> NDArray[np.float32]:
    """Apply Matryoshka truncation and normalization as the request asks."""
    dim = vectors.shape[1]
    if request.dimensions is not None:
        if request.dimensions > dim:
            raise InvalidRequest(
                f"'dimensions' is {request.dimensions}, but this model has {dim}: ask for "
                f"{dim} or fewer"
            )
        vectors = vectors[:, : request.dimensions]
    normalize = model_normalizes if request.normalize is None else request.normalize
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, dtype=np.float32)


def json_with_vectors(value: object) -> bytes:
    """JSON with float32 arrays written straight from the array, without Python floats:
    each number is the shortest text that reads back as the same float32 (msgspec, after
    ``tolist()``, writes the float64 digits of the same value: longer, the same vector).
    Rows must be C-contiguous, as ``shape_vectors`` returns them."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def base64_rows(vectors: NDArray[np.float32]) -> list[str]:
    """Each row's little-endian float32 bytes in base64, read from the array in place."""
    raw = memoryview(np.ascontiguousarray(vectors, dtype="<f4").data).cast("B")
    width = vectors.shape[1] * 4
    return [
        base64.b64encode(raw[i * width : (i + 1) * width]).decode("ascii")
        for i in range(vectors.shape[0])
    ]


def encode_embed(
    shape: ApiShape, request: EmbedRequest, vectors: NDArray[np.float32], model: str, tokens: int
) -> bytes:
    if shape is ApiShape.RAW_VECTORS:
        return np.ascontiguousarray(vectors, dtype="<f4").tobytes()
    if shape is ApiShape.TEI_EMBED:
        return json_with_vectors(vectors)
    items: list[object] = [*base64_rows(vectors)] if request.encoding == "base64" else [*vectors]
    return json_with_vectors(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": item}
                for i, item in enumerate(items)
            ],
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def raw_vectors_body(
    texts: list[str], *, truncate: bool = False, use: PromptUse | None = None
) -> bytes:
    """The body of a RAW_VECTORS job: what ingest and search send through the queue.
    ``use`` says whether the texts are queries or documents, for models with prompts."""
    body: dict[str, object] = {"inputs": texts, "truncate": truncate}
    if use is not None:
        body["input_type"] = use
    return msgspec.json.encode(body)


def decode_raw_vectors(body: bytes, count: int) -> NDArray[np.float32]:
    """The (count, dim) float32 vectors of a RAW_VECTORS reply."""
    flat = np.frombuffer(body, dtype="<f4")
    return flat.reshape(count, flat.size // count).astype(np.float32)
