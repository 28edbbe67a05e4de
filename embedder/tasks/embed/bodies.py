"""Request bodies as clients send them, one msgspec struct per API shape.

The codecs decode with these very structs; ``BODIES`` (shape -> struct) is what the
OpenAPI document's request models (``gateway.schemas``) are held to, field for field, by
a test, so the document cannot drift from the decoders. Unknown fields are ignored, as
the reference servers do.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from embedder.tasks.embed import codecs
from embedder.tasks.generate import requests as generation_requests
from embedder.core.jobs import ApiShape
from embedder.tasks.ocr import api as ocr_api

# -- Cohere v2 (/v2/embed, /v2/rerank), as the cohere SDK's ClientV2 sends them ---------

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class TextContent(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ImageUrlContent(msgspec.Struct, tag_field="type", tag="image_url"):
    image_url: dict[str, str] | str | None = None


class CohereInput(msgspec.Struct):
    """One input of ``inputs``: its parts make one embedding."""

    content: list[TextContent | ImageUrlContent]


class CohereEmbedV2(msgspec.Struct):
    model: str | None = None
    input_type: str | None = None  # search_query, search_document, classification, clustering
    texts: list[str] | None = None
    inputs: list[CohereInput] | None = None
    images: list[str] | None = None  # refused: the fleet embeds text
    embedding_types: list[EmbeddingType] | None = None  # None: float
    truncate: Literal["NONE", "START", "END"] = "END"  # Cohere's default cuts the end
    output_dimension: int | None = None
    max_tokens: int | None = None


class CohereRerankV2(msgspec.Struct):
    query: str
    documents: list[str]
    model: str | None = None
    top_n: int | None = None
    max_tokens_per_doc: int | None = None


# -- TEI's similarity (/similarity, and the root: what huggingface_hub posts) -----------


class SimilarityInput(msgspec.Struct):
    source_sentence: str
    sentences: list[str]


class SimilarityParameters(msgspec.Struct):
    truncate: bool | None = None
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    prompt_name: str | None = None


class TeiSimilarity(msgspec.Struct):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class TeiRoot(msgspec.Struct):
    """TEI's root takes an embed body (the fields of /embed's) or a similarity one (with
    ``parameters``); ``inputs`` tells which."""

    inputs: str | list[str] | SimilarityInput
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    dimensions: int | None = None
    prompt_name: str | None = None
    input_type: str | None = None
    parameters: SimilarityParameters | None = None


BODIES: dict[ApiShape, type[msgspec.Struct]] = {
    ApiShape.OPENAI_EMBEDDINGS: codecs._OpenAIEmbeddings,
    ApiShape.TEI_EMBED: codecs._TeiEmbed,
    ApiShape.TEI_ROOT: TeiRoot,
    ApiShape.TEI_SIMILARITY: TeiSimilarity,
    ApiShape.TEI_RERANK: codecs._TeiRerank,
    ApiShape.COHERE_RERANK: codecs._CohereRerank,
    ApiShape.COHERE_EMBED_V2: CohereEmbedV2,
    ApiShape.COHERE_RERANK_V2: CohereRerankV2,
    ApiShape.RAW_VECTORS: codecs._TeiEmbed,
    ApiShape.OPENAI_CHAT: generation_requests.ChatBody,
    ApiShape.OPENAI_COMPLETIONS: generation_requests.CompletionBody,
    ApiShape.MISTRAL_OCR: ocr_api.OcrBody,
}
