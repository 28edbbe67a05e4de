"""The request and response bodies as the OpenAPI document describes them.

Documentation only: the handlers take the raw request and never validate with these
(the gateway reads only the routing fields; the worker decodes the body with the msgspec
structs of ``embedder.codecs``, which a test holds to the same fields). ``BODIES`` says
which documents each API shape's route; ``gateway.openapi`` puts them in the document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from embedder.jobs import ApiShape

Text = Annotated[str, Field(min_length=1)]  # nor only whitespace: a 422 names the input
Texts = Annotated[list[Text], Field(min_length=1)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]  # what a payload index matches
InputType = Literal["query", "search_query", "document", "passage", "search_document"]
Direction = Literal["right", "left", "Right", "Left"]

_MODEL = "A model of the fleet by name or alias (GET /v1/models), or 'model:adapter'."
_ADAPTER = "A LoRA adapter of the model, served per request (also 'model:adapter')."
_TRUNCATE = (
    "Cut inputs longer than the model's window (any length up to the body limit) instead "
    "of answering 413; unset: the server's --auto-truncate."
)


class _Body(BaseModel):
    # Unknown fields are ignored, as the reference servers do.
    model_config = ConfigDict(extra="allow")


class OpenAIEmbeddingsRequest(_Body):
    input: Text | Texts = Field(
        description="A text or a list of texts, none empty or only whitespace (422).",
    )
    model: str | None = Field(default=None, description=_MODEL)
    adapter: str | None = Field(default=None, description=_ADAPTER)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(
        default=None, gt=0, description="Keep the first N dimensions (Matryoshka), renormalized."
    )
    user: str | None = None
    input_type: InputType | None = Field(
        default=None, description="What the texts are for; picks the model's prompt (e5)."
    )


class TEIEmbedRequest(_Body):
    inputs: Text | Texts = Field(
        description="A text or a list of texts, none empty or only whitespace (422).",
    )
    model: str | None = Field(default=None, description=_MODEL)
    adapter: str | None = Field(default=None, description=_ADAPTER)
    normalize: bool = True
    truncate: bool | None = Field(default=None, description=_TRUNCATE)
    truncation_direction: Direction = "right"
    dimensions: int | None = Field(default=None, gt=0)
    prompt_name: str | None = Field(default=None, description="One of the model's prompts.")
    input_type: InputType | None = None


class TEIRerankRequest(_Body):
    query: Text
    texts: Texts
    model: str | None = Field(default=None, description=_MODEL)
    adapter: str | None = Field(default=None, description=_ADAPTER)
    truncate: bool | None = Field(default=None, description=_TRUNCATE)
    truncation_direction: Direction = "right"
    raw_scores: bool = Field(default=False, description="Logits instead of sigmoid scores.")
    return_text: bool = False


class CohereDocument(BaseModel):
    text: Text


class CohereRerankRequest(_Body):
    query: Text
    documents: list[Text | CohereDocument] = Field(min_length=1)
    model: str | None = Field(default=None, description=_MODEL)
    adapter: str | None = Field(default=None, description=_ADAPTER)
    top_n: int | None = Field(default=None, gt=0)
    return_documents: bool = False


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # as the search decoder: a typo is a 422

    query: str = Field(min_length=1, description="Embedded with the collection's model.")
    limit: int = Field(default=10, ge=1, le=1000)
    filter: dict[str, str | Int64 | bool | list[str] | list[Int64]] | None = Field(
        default=None,
        description="Payload path -> exact value, or a non-empty list of alternatives; ANDed.",
    )


# -- responses ---------------------------------------------------------------------


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


class CohereResult(BaseModel):
    index: int
    relevance_score: float
    document: CohereDocument | None = None


class CohereUsage(BaseModel):
    total_tokens: int


class CohereRerankResponse(BaseModel):
    id: str
    model: str
    results: list[CohereResult]
    usage: CohereUsage


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


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    models: dict[str, Literal["loading", "ready", "failed"]]


# -- errors, in each route's shape (gateway.errors.error_shape picks one) --------------


class OpenAIErrorDetail(BaseModel):
    message: str = Field(description="What went wrong and which setting or field changes it.")
    type: str = Field(description="The error's class, e.g. invalid_request, overloaded.")
    code: int = Field(description="The HTTP status.")


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


class TEIError(BaseModel):
    error: str = Field(description="What went wrong and which setting or field changes it.")
    error_type: str = Field(description="The error's class, e.g. invalid_request, overloaded.")


@dataclass(frozen=True, slots=True)
class Bodies:
    """What a route takes and what it answers with 200."""

    request: type[BaseModel]
    response: object  # a model, or a type such as list[list[float]]


# Each API shape's bodies. A route of a new shape adds its entry here and in
# gateway.app.ROUTES; gateway.openapi documents it from this.
BODIES: dict[ApiShape, Bodies] = {
    ApiShape.OPENAI_EMBEDDINGS: Bodies(OpenAIEmbeddingsRequest, OpenAIEmbeddingsResponse),
    ApiShape.TEI_EMBED: Bodies(TEIEmbedRequest, list[list[float]]),
    ApiShape.TEI_RERANK: Bodies(TEIRerankRequest, list[TEIRank]),
    ApiShape.COHERE_RERANK: Bodies(CohereRerankRequest, CohereRerankResponse),
}
SEARCH = Bodies(SearchRequest, SearchResponse)
