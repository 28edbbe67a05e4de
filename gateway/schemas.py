"""The request bodies as the OpenAPI document describes them, and which route takes which.

Documentation only: the handlers take the raw request and never validate with these
(the gateway reads only the routing fields; the worker decodes the body with its task
kind's msgspec structs, ``TaskKind.bodies``, which a test holds to the same fields).
``DOCUMENTED`` says what each API shape's route takes and answers; ``gateway.openapi``
puts it in the document. What a route answers is in ``gateway.answers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from embedder.core.jobs import ApiShape
from gateway import answers

Text = Annotated[str, Field(min_length=1)]  # nor only whitespace: a 422 names the input
Texts = Annotated[list[Text], Field(min_length=1)]
Positive = Annotated[int, Field(gt=0)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]  # what a payload index matches
InputType = Literal["query", "search_query", "document", "passage", "search_document"]
Direction = Literal["right", "left", "Right", "Left"]

_MODEL = "A model of the fleet by name or alias (GET /v1/models), or 'model:adapter'."
_ADAPTER = "A LoRA adapter of the model, served per request (also 'model:adapter')."
_TRUNCATE = (
    "Cut inputs longer than the model's window (any length up to the body limit) instead "
    "of answering 413; unset: the server's --auto-truncate."
)
_TEXTS = "A text or a list of texts, none empty or only whitespace (422)."


class _Body(BaseModel):
    # Unknown fields are ignored, as the reference servers do.
    model_config = ConfigDict(extra="allow")

    model: str | None = Field(default=None, description=_MODEL)
    adapter: str | None = Field(default=None, description=_ADAPTER)


# -- OpenAI, TEI, Cohere v1 -------------------------------------------------------------


class OpenAIEmbeddingsRequest(_Body):
    input: Text | Texts = Field(description=_TEXTS)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Positive | None = Field(
        default=None, description="Keep the first N dimensions (Matryoshka), renormalized."
    )
    user: str | None = None
    input_type: InputType | None = Field(
        default=None, description="What the texts are for; picks the model's prompt (e5)."
    )


class TEIEmbedRequest(_Body):
    inputs: Text | Texts = Field(description=_TEXTS)
    normalize: bool = True
    truncate: bool | None = Field(default=None, description=_TRUNCATE)
    truncation_direction: Direction = "right"
    dimensions: Positive | None = None
    prompt_name: str | None = Field(default=None, description="One of the model's prompts.")
    input_type: InputType | None = None


class TEIRerankRequest(_Body):
    query: Text
    texts: Texts
    truncate: bool | None = Field(default=None, description=_TRUNCATE)
    truncation_direction: Direction = "right"
    raw_scores: bool = Field(default=False, description="Logits instead of sigmoid scores.")
    return_text: bool = False


class CohereDocument(BaseModel):
    text: Text


class CohereRerankRequest(_Body):
    query: Text
    documents: list[Text | CohereDocument] = Field(min_length=1)
    top_n: Positive | None = None
    return_documents: bool = False


# -- TEI similarity, and TEI's root (an /embed body or a /similarity one) ----------------


class SimilarityInput(BaseModel):
    source_sentence: Text
    sentences: Texts


class SimilarityParameters(BaseModel):
    truncate: bool | None = Field(default=None, description=_TRUNCATE)
    truncation_direction: Direction = "right"
    prompt_name: str | None = None


class TEISimilarityRequest(_Body):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class TEIRootRequest(TEIEmbedRequest):
    inputs: Text | Texts | SimilarityInput = Field(  # type: ignore[assignment]
        description=_TEXTS + " Or {source_sentence, sentences}: their cosines, as /similarity."
    )
    parameters: SimilarityParameters | None = None


# -- Cohere v2 ---------------------------------------------------------------------------


class TextContent(BaseModel):
    type: Literal["text"]
    text: str


class ImageUrlContent(BaseModel):
    type: Literal["image_url"]
    image_url: dict[str, str] | str | None = None


class CohereInput(BaseModel):
    content: list[Annotated[TextContent | ImageUrlContent, Field(discriminator="type")]]


class CohereEmbedV2Request(_Body):
    texts: Texts | None = Field(default=None, description="Either texts or inputs.")
    inputs: Annotated[list[CohereInput], Field(min_length=1)] | None = Field(
        default=None, description="Texts as content parts; image parts are refused (422)."
    )
    images: list[str] | None = Field(default=None, description="Refused: the fleet embeds text.")
    input_type: (
        Literal["search_query", "search_document", "classification", "clustering"] | None
    ) = None
    embedding_types: (
        Annotated[
            list[Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]],
            Field(min_length=1),
        ]
        | None
    ) = None
    truncate: Literal["NONE", "START", "END"] = "END"
    output_dimension: Positive | None = None
    max_tokens: Positive | None = Field(
        default=None, description="Per input; below the model's window it is refused (422)."
    )


class CohereRerankV2Request(_Body):
    query: Text
    documents: Texts
    top_n: Positive | None = None
    max_tokens_per_doc: Positive | None = None


# -- OpenAI generation ---------------------------------------------------------------


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(description="system, user, assistant (as the chat template knows).")
    content: str | list[TextContent] | None = None


class StreamOptions(BaseModel):
    include_usage: bool = Field(
        default=False, description="One more chunk before [DONE] with the usage counts."
    )


class _Generation(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, as OpenAI does

    model: str | None = Field(
        default=None, description="A generation model of the fleet (GET /v1/models)."
    )
    adapter: None = Field(default=None, description="Refused (422): no adapters for generation.")
    max_tokens: Positive | None = Field(
        default=None,
        description="New tokens at most; unset, the model's max_new_tokens. Prompt plus "
        "this over the model's window answers 400.",
    )
    temperature: Annotated[float, Field(ge=0, le=2)] | None = Field(
        default=None, description="0 is greedy; unset, 1."
    )
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = Field(
        default=None, description="Generation ends before the first of these strings."
    )
    seed: Int64 | None = Field(default=None, description="Repeats a sampled answer.")
    n: Literal[1] | None = Field(default=None, description="One choice per request (else 422).")
    stream: bool | None = Field(default=None, description="Server-sent events, then [DONE].")
    stream_options: StreamOptions | None = None
    return_token_ids: bool = Field(
        default=False, description="vLLM's extension: the generated token ids in each choice."
    )


class ChatCompletionRequest(_Generation):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Positive | None = Field(
        default=None, description="OpenAI's newer name for max_tokens; wins over it."
    )


class CompletionRequest(_Generation):
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=1)] | list[int] = Field(
        description="One prompt: a string (or a list of one), or token ids."
    )


# -- OCR (Mistral's shape) ---------------------------------------------------------------


class ImageUrlChunk(BaseModel):
    type: Literal["image_url"]
    image_url: str | dict[str, str] = Field(
        description="data:image/png;base64,... (or {'url': ...}); PNG, JPEG, WebP, TIFF, "
        "BMP, GIF. A path or file URL under --ocr-local-roots; http(s) is refused (422)."
    )


class DocumentUrlChunk(BaseModel):
    type: Literal["document_url"]
    document_url: str = Field(
        description="data:application/pdf;base64,... (a PDF or an image), or a path or "
        "file URL under --ocr-local-roots; http(s) is refused (422): nothing is fetched."
    )


class OcrRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, as Mistral does

    model: str | None = Field(default=None, description="An OCR model of the fleet.")
    adapter: None = Field(default=None, description="Refused (422): OCR serves no adapters.")
    document: Annotated[ImageUrlChunk | DocumentUrlChunk, Field(discriminator="type")]
    pages: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        description="0-based pages to read, at most --ocr-max-pages; unset, every page.",
    )


# -- collections -------------------------------------------------------------------------


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # as the search decoder: a typo is a 422

    query: str = Field(min_length=1, description="Embedded with the collection's model.")
    limit: int = Field(default=10, ge=1, le=1000)
    filter: dict[str, str | Int64 | bool | list[str] | list[Int64]] | None = Field(
        default=None,
        description="Payload path -> exact value, or a non-empty list of alternatives; ANDed.",
    )


class DocumentIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    text: str
    metadata: dict[str, Any] | None = None


class DocumentsUpsert(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Anything is taken per document: one that breaks the record contract fails alone,
    # in the answer, and the rest are stored.
    documents: list[DocumentIn | Any] = Field(min_length=1)
    model: str | None = Field(default=None, description=_MODEL)


class DocumentsDelete(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[str] = Field(min_length=1)


class AdminModelEntry(BaseModel):
    """A fleet entry and its name: the fields an entry of the fleet file takes under its
    name (docs/guide/fleet.md), which depend on its task kind."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "name": "legal-embed",
                    "source": {"path": "/models/legal-embed"},
                    "max_tokens": 512,
                    "load": "on_demand",
                }
            ]
        },
    )

    name: str = Field(min_length=1, description="The model's name in requests.")
    task: str = Field(
        default="embed", description="The task kind (embed, rerank, generate, ocr, ...)."
    )
    source: dict[str, Any] = Field(
        description="Where the weights live, as the server's machine sees them: 'path', "
        "'package' or 'import'."
    )


@dataclass(frozen=True, slots=True)
class Bodies:
    """What a route takes and what it answers with 200."""

    request: type[BaseModel]
    response: object  # a model, or a type such as list[list[float]]


# Each API shape's bodies, keyed by the shape's name (an ApiShape is a str; a kind's own
# shape may be a plain one). A kind's route (TaskKind.routes) is documented from its entry
# here; a route whose shape has none is served undocumented.
DOCUMENTED: dict[str, Bodies] = {
    ApiShape.OPENAI_EMBEDDINGS: Bodies(OpenAIEmbeddingsRequest, answers.OpenAIEmbeddingsResponse),
    ApiShape.TEI_EMBED: Bodies(TEIEmbedRequest, list[list[float]]),
    ApiShape.TEI_ROOT: Bodies(TEIRootRequest, list[list[float]] | list[float]),
    ApiShape.TEI_SIMILARITY: Bodies(TEISimilarityRequest, list[float]),
    ApiShape.TEI_RERANK: Bodies(TEIRerankRequest, list[answers.TEIRank]),
    ApiShape.COHERE_RERANK: Bodies(CohereRerankRequest, answers.CohereRerankResponse),
    ApiShape.COHERE_EMBED_V2: Bodies(CohereEmbedV2Request, answers.CohereEmbedV2Response),
    ApiShape.COHERE_RERANK_V2: Bodies(CohereRerankV2Request, answers.CohereRerankV2Response),
    ApiShape.OPENAI_CHAT: Bodies(ChatCompletionRequest, answers.ChatCompletionResponse),
    ApiShape.OPENAI_COMPLETIONS: Bodies(CompletionRequest, answers.CompletionResponse),
    ApiShape.MISTRAL_OCR: Bodies(OcrRequest, answers.OcrResponse),
}
SEARCH = Bodies(SearchRequest, answers.SearchResponse)
UPSERT = Bodies(DocumentsUpsert, answers.DocumentsUpserted)
DELETE = Bodies(DocumentsDelete, answers.DocumentsDeleted)
ADMIN_ADD = Bodies(AdminModelEntry, answers.AdminModelAdded)
