"""What the routes answer, as the OpenAPI document describes it: each route's 200 body,
and the two error shapes (``gateway.errors.error_shape`` picks one by path).

Documentation only, as ``gateway.schemas`` is: the worker's codecs write these bodies,
and the schema fuzzer (tests/gateway/test_fuzz.py) checks every answer against them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from embedder.core.jobs import ModelState
from ingest.health import IngestState

# -- OpenAI, TEI, Cohere v1 -------------------------------------------------------------


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="Floats, or base64 little-endian float32.")


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: OpenAIUsage


class TEIRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class CohereText(BaseModel):
    text: str


class CohereResult(BaseModel):
    index: int
    relevance_score: float
    document: CohereText | None = None


class CohereUsage(BaseModel):
    total_tokens: int


class CohereRerankResponse(BaseModel):
    id: str
    model: str
    results: list[CohereResult]
    usage: CohereUsage


# -- Cohere v2 ---------------------------------------------------------------------------


class CohereApiVersion(BaseModel):
    version: str


class CohereBilledUnits(BaseModel):
    input_tokens: int


class CohereMeta(BaseModel):
    api_version: CohereApiVersion
    billed_units: CohereBilledUnits


class CohereEmbeddings(BaseModel):
    """One list per asked embedding type, a row per text."""

    float_: list[list[float]] | None = Field(default=None, alias="float")
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class CohereEmbedV2Response(BaseModel):
    id: str
    embeddings: CohereEmbeddings
    texts: list[str]
    meta: CohereMeta
    response_type: Literal["embeddings_by_type"]


class CohereV2Result(BaseModel):
    index: int
    relevance_score: float


class CohereRerankV2Response(BaseModel):
    id: str
    results: list[CohereV2Result]
    meta: CohereMeta


# -- OpenAI generation ---------------------------------------------------------------


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    """With ``stream: true``: text/event-stream of chat.completion.chunk objects."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class CompletionResponse(BaseModel):
    """With ``stream: true``: text/event-stream of text_completion objects."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage


# -- collections -------------------------------------------------------------------------


class OcrLine(BaseModel):
    text: str
    confidence: float = Field(
        description="Mean probability of the line's characters; 1 for text layers."
    )
    bbox: list[float] = Field(description="[x0, y0, x1, y1] in the page image's pixels.")
    polygon: list[list[float]] = Field(description="Four corners, clockwise from top-left.")


class OcrDimensions(BaseModel):
    dpi: int | None = Field(description="A PDF page's rendering resolution; null for images.")
    height: int
    width: int


class OcrPage(BaseModel):
    index: int
    markdown: str = Field(description="The page's text in reading order.")
    images: list[Any] = Field(description="Always empty: no images are extracted.")
    dimensions: OcrDimensions
    source: Literal["ocr", "text_layer"] = Field(
        description="'text_layer': a PDF page read from its own text, without OCR."
    )
    lines: list[OcrLine]


class OcrUsage(BaseModel):
    pages_processed: int
    doc_size_bytes: int


class OcrResponse(BaseModel):
    pages: list[OcrPage]
    model: str
    document_annotation: None = None
    usage_info: OcrUsage


class SearchHit(BaseModel):
    id: str
    score: float
    payload: dict[str, object] | None


class SearchUsage(BaseModel):
    prompt_tokens: int


class SearchResponse(BaseModel):
    collection: str
    model: str
    results: list[SearchHit]
    usage: SearchUsage


class DocumentRejected(BaseModel):
    message: str = Field(description="Why the document was not stored; the rest were.")
    type: Literal["document_rejected"]


class DocumentOutcome(BaseModel):
    index: int = Field(description="The document's position in the request.")
    id: str | None
    status: Literal["upserted", "deleted", "failed"]
    error: DocumentRejected | None = None


class DocumentsUpserted(BaseModel):
    collection: str
    model: str
    upserted: int
    failed: int
    results: list[DocumentOutcome]


class DocumentsDeleted(BaseModel):
    collection: str
    deleted: int
    failed: int
    results: list[DocumentOutcome]


# -- probes ------------------------------------------------------------------------------


class IngestReadiness(BaseModel):
    """The Kafka ingest of this process (``serve --kafka --topic``)."""

    state: IngestState = Field(
        description="'waiting': running, but paused while the vector store is unavailable "
        "(nothing is committed or skipped; it resumes by itself)."
    )
    topic: str
    restarts: int = Field(description="Times the ingest loop failed and was restarted.")
    last_error: str | None = Field(
        description="Why the last run failed, until one runs again; while waiting, why the "
        "store is unavailable."
    )


class Readiness(BaseModel):
    status: Literal["ready", "not_ready", "degraded"] = Field(
        description="'degraded': the models serve, but this process's ingest is not running."
    )
    models: dict[str, ModelState]
    ingest: IngestReadiness | None = Field(
        default=None, description="Present when this process runs Kafka ingest."
    )


# -- the admin API ------------------------------------------------------------------------


class AdminModel(BaseModel):
    name: str
    task: str
    aliases: list[str]
    load: Literal["start", "on_demand"]
    pinned: bool = Field(description="Never evicted to make room for another model.")
    state: ModelState
    details: dict[str, Any] = Field(
        description="What the host says of it: its runtime and profile, its residency, or "
        "why it failed to load."
    )
    entry: dict[str, Any] = Field(
        description="Its fleet entry, every field given (defaults included), as the fleet "
        "file would hold it under its name."
    )


class AdminModels(BaseModel):
    object: Literal["list"]
    kept: str = Field(description="Where changes made through the admin API are kept.")
    data: list[AdminModel]


class AdminModelAdded(BaseModel):
    name: str
    entry: dict[str, Any] = Field(description="The entry as the server parsed it.")
    kept: str = Field(
        description="'kept in FILE' with --fleet-state; else the change lasts until the "
        "server stops."
    )


class AdminModelRemoved(BaseModel):
    name: str
    kept: str


# -- errors, in each route's shape ---------------------------------------------------------


class OpenAIErrorDetail(BaseModel):
    message: str = Field(description="What went wrong and which setting or field changes it.")
    type: str = Field(description="The error's class, e.g. invalid_request, overloaded.")
    code: int = Field(description="The HTTP status.")


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


class TEIError(BaseModel):
    error: str = Field(description="What went wrong and which setting or field changes it.")
    error_type: str = Field(description="The error's class, e.g. invalid_request, overloaded.")
