"""The OCR job's contract: the ``/v1/ocr`` request body in, its response body out.

An OCR job on the work queue is an ``Job`` with ``shape=ApiShape.MISTRAL_OCR``
(task ``ocr``): its ``body`` is the ``/v1/ocr`` request JSON and its result's body is the
``/v1/ocr`` response JSON, so any producer (the gateway, ingest) puts the same bytes a
client would POST and reads what a client would get back. ``est_tokens`` counts
``TOKENS_PER_PAGE`` per page expected (``estimate_tokens``).

Request (Mistral's OCR shape; unknown fields are ignored)::

    {"model": "ppocrv5-mobile",                        # optional: the fleet's OCR model
     "document": {"type": "image_url", "image_url": "data:image/png;base64,..."}
              |  {"type": "document_url", "document_url": "data:application/pdf;base64,..."}
              |  {"type": "document_url", "document_url": "file:///srv/scans/a.pdf"},
     "pages": [0, 2]}                                  # optional: 0-based pages to read

A ``document_url`` may be a data: URL (a PDF or an image), or a ``file://`` URL or plain
path under one of the worker's ``--ocr-local-roots``; http(s) URLs are refused (422):
nothing is fetched. An ``image_url`` may also be a bare base64 string.

Response::

    {"pages": [{"index": 0,
                "markdown": "First line\\nSecond line",     # reading order
                "images": [],
                "dimensions": {"dpi": 200, "height": 2339, "width": 1654},
                "source": "ocr" | "text_layer",              # how the text was read
                "lines": [{"text": "First line", "confidence": 0.98,
                           "bbox": [x0, y0, x1, y1],         # pixels of that page image
                           "polygon": [[x, y], [x, y], [x, y], [x, y]]}]}],
     "model": "ppocrv5-mobile",
     "document_annotation": null,
     "usage_info": {"pages_processed": 1, "doc_size_bytes": 12345}}

Errors are the classes of ``embedder.core.errors``: a document over a limit is a
``LimitExceeded`` (413), one that cannot be read an ``InvalidRequest`` (422) saying why.
Free of numpy, OpenCV and ONNX Runtime: the gateway reads ``Routing`` from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec
import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from embedder.core.errors import InvalidRequest, LimitExceeded
from embedder.core.rawjson import decode_struct

TOKENS_PER_PAGE = 1_000  # about the text a page holds: admission's unit for an OCR job
PDF_BYTES_PER_PAGE = 100_000  # a PDF's page count guessed from its size, unparsed
BASE64_RATIO = 3 / 4  # decoded bytes per base64 character


class OcrLimits(BaseModel):
    """What one OCR request may hold, checked where the document is decoded (the pages
    and the size also at the gateway). ``flotilla.settings`` holds it as its ``ocr``
    section: each field is a setting, named by its alias."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True)

    max_document_bytes: int = Field(
        default=20_000_000,
        gt=0,
        validation_alias="ocr_max_document_bytes",
        description="Largest document (image or PDF) one OCR request may carry, decoded, "
        "or a local file may have (413 above). Also bounded by --max-body-bytes for "
        "documents sent in the body (base64 takes 4/3 of the bytes).",
    )
    max_pages: int = Field(
        default=64,
        gt=0,
        validation_alias="ocr_max_pages",
        description="Most pages one OCR request may read (413 above): one request holds "
        "the OCR worker for all its pages, so lower keeps other requests' latency down.",
    )
    max_pixels: int = Field(
        default=40_000_000,
        gt=0,
        validation_alias="ocr_max_pixels",
        description="Most pixels of one page image, read from its header before it is "
        "decoded (413 above); a PDF page is rendered at a lower resolution to fit. Each "
        "million pixels costs 3 MB of memory while the page is read.",
    )
    pdf_dpi: float = Field(
        default=200.0,
        gt=0,
        le=1200,
        validation_alias="ocr_pdf_dpi",
        description="Resolution PDF pages without a text layer are rendered at for OCR: "
        "higher reads smaller print, and costs memory and time with its square.",
    )
    local_roots: tuple[Path, ...] = Field(
        default=(),
        validation_alias="ocr_local_roots",
        description="Folders an OCR request's file URL or path may point into, "
        "comma-separated, checked after symlinks resolve; empty: documents only in the "
        "request body. Read by the worker, on its machine.",
    )

    @field_validator("local_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        if isinstance(value, str | Path):  # the variable, or the flag (parsed as a path)
            return [Path(root.strip()) for root in str(value).split(",") if root.strip()]
        return value


class _DocumentRouting(msgspec.Struct):
    type: str = ""


class Routing(msgspec.Struct):
    """What the gateway reads of an OCR body: the model, the document's type and the pages
    asked for; the document itself is skipped, not decoded."""

    model: str | None = None
    adapter: str | None = None
    document: _DocumentRouting | None = None
    pages: list[int] | None = None


class _Document(msgspec.Struct):
    type: str = ""
    image_url: str | dict[str, str] | None = None
    document_url: str | None = None


class OcrBody(msgspec.Struct):
    model: str | None = None
    document: _Document | None = None
    pages: list[int] | None = None


DocumentKind = Literal["image_url", "document_url"]


@dataclass(frozen=True, slots=True)
class OcrRequest:
    kind: DocumentKind
    url: str  # a data: URL, a file URL or path, or bare base64 (images)
    pages: tuple[int, ...] | None  # None: every page


def check_type(document_type: str | None) -> None:
    if document_type not in ("image_url", "document_url"):
        got = "no document" if document_type is None else f"type {document_type!r}"
        raise InvalidRequest(
            f"document must be {{'type': 'image_url', 'image_url': ...}} or "
            f"{{'type': 'document_url', 'document_url': ...}}; got {got}"
        )


def check_routing(routing: Routing, max_pages: int) -> None:
    """What the gateway can refuse before queueing: a missing or unknown document type,
    more pages than the limit, a negative page."""
    check_type(None if routing.document is None else routing.document.type)
    if routing.pages is not None:
        if len(routing.pages) > max_pages:
            raise LimitExceeded(
                f"{len(routing.pages)} pages asked for, over the limit of {max_pages}: split "
                "the request, or raise --ocr-max-pages (FLOTILLA_OCR_MAX_PAGES)"
            )
        if any(page < 0 for page in routing.pages):
            raise InvalidRequest("pages are 0-based indices: none may be negative")


def estimate_tokens(routing: Routing, body_bytes: int, max_pages: int) -> int:
    """The job's size for admission and the worker's budget: TOKENS_PER_PAGE per page
    expected (the pages asked for, one for an image, a PDF's guessed from its size)."""
    if routing.pages:
        pages = len(routing.pages)
    elif routing.document is not None and routing.document.type == "image_url":
        pages = 1
    else:
        pages = math.ceil(body_bytes * BASE64_RATIO / PDF_BYTES_PER_PAGE)
    return TOKENS_PER_PAGE * min(max(1, pages), max_pages)


def decode(body: bytes) -> OcrRequest:
    req = decode_struct(body, OcrBody)
    document = req.document
    check_type(None if document is None else document.type)
    assert document is not None
    url: str | None
    if document.type == "image_url":
        raw = document.image_url
        url = raw.get("url") if isinstance(raw, dict) else raw  # OpenAI's {"url": ...} too
    else:
        url = document.document_url
    if not url:
        raise InvalidRequest(f"document.{document.type} is missing or empty")
    pages = tuple(req.pages) if req.pages is not None else None
    if pages is not None and any(page < 0 for page in pages):
        raise InvalidRequest("pages are 0-based indices: none may be negative")
    kind: DocumentKind = "image_url" if document.type == "image_url" else "document_url"
    return OcrRequest(kind, url, pages)


# -- the response ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Line:
    text: str
    confidence: float
    polygon: tuple[tuple[float, float], ...]  # four corners, clockwise from top-left

    @property
    def bbox(self) -> tuple[float, float, float, float]:
        xs = [x for x, _ in self.polygon]
        ys = [y for _, y in self.polygon]
        return (min(xs), min(ys), max(xs), max(ys))


@dataclass(frozen=True, slots=True)
class PageText:
    index: int
    width: int
    height: int
    dpi: float | None
    source: Literal["ocr", "text_layer"]
    blocks: tuple[tuple[tuple[Line, ...], ...], ...]  # reading order: block, row, line

    @property
    def markdown(self) -> str:
        """Rows on lines of their own, the boxes of a row joined by a space, blocks (the
        columns and full-width sections) apart by a blank line."""
        return "\n\n".join(
            "\n".join(" ".join(line.text for line in row) for row in block) for block in self.blocks
        )


def _line(line: Line) -> dict[str, object]:
    return {
        "text": line.text,
        "confidence": round(line.confidence, 4),
        "bbox": [round(v, 1) for v in line.bbox],
        "polygon": [[round(x, 1), round(y, 1)] for x, y in line.polygon],
    }


def encode(model: str, pages: list[PageText], doc_size_bytes: int) -> bytes:
    return orjson.dumps(
        {
            "pages": [
                {
                    "index": page.index,
                    "markdown": page.markdown,
                    "images": [],
                    "dimensions": {
                        "dpi": None if page.dpi is None else round(page.dpi),
                        "height": page.height,
                        "width": page.width,
                    },
                    "source": page.source,
                    "lines": [
                        _line(line) for block in page.blocks for row in block for line in row
                    ],
                }
                for page in pages
            ],
            "model": model,
            "document_annotation": None,
            "usage_info": {"pages_processed": len(pages), "doc_size_bytes": doc_size_bytes},
        }
    )
