"""The documents route admits a scanned document by its pages, as /v1/ocr counts it, and
a text document by its size: a 400 KB base64 page is not 100,000 tokens."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

from embedder.tasks.ocr.api import TOKENS_PER_PAGE
from gateway.config import GatewayConfig
from gateway.documents import CollectionDocuments


def route() -> CollectionDocuments:
    config = GatewayConfig(version="test", bytes_per_token=4.0, max_documents_per_request=512)
    return CollectionDocuments(SimpleNamespace(config=config), core=None)  # type: ignore[arg-type]


def test_a_scanned_page_counts_as_a_page_and_text_by_its_size() -> None:
    image = "data:image/png;base64," + base64.b64encode(b"\x89PNG" + bytes(300_000)).decode()
    scanned = json.dumps({"id": "scan", "document": {"type": "image_url", "image_url": image}})
    text = json.dumps({"id": "t", "text": "x" * 4000})
    assert route()._tokens(scanned.encode()) == TOKENS_PER_PAGE
    assert route()._tokens(text.encode()) == -(-len(text) // 4)
    pages = json.dumps(
        {"id": "p", "document": {"type": "document_url", "document_url": "a.pdf"}, "pages": [0, 2]}
    )
    assert route()._tokens(pages.encode()) == 2 * TOKENS_PER_PAGE
    # A text that merely mentions "document" is still text.
    assert route()._tokens(b'{"id": "d", "text": "\\"document\\""}') == 9
