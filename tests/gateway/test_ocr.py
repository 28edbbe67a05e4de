"""POST /v1/ocr through a running HTTP server with the real PP-OCRv5 model: rendered
text read back, a PDF answered from its text layer, an image-only PDF OCR'd page by
page, and poison documents refused with a clear 4xx while good requests go on."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from embedder.tasks.fleet import load_fleet
from flotilla.settings import Settings
from tests.embedder.tasks.ocr.samples import (
    broken_xref_pdf,
    image_pdf,
    png_bytes,
    render_lines,
    repairable_xref_pdf,
    text_pdf,
)
from tests.embedder.tasks.ocr.test_documents import huge_png_header
from tests.gateway.live import Live, live_server

MODEL = "ppocrv5-mobile"


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scans")


@pytest.fixture(scope="module")
def server(roots: Path) -> Iterator[Live]:
    fleet = load_fleet().only([MODEL, "all-minilm-l6-v2"])  # the embedder runs as a fake
    settings = Settings(ocr_local_roots=[roots], ocr_max_pages=4, max_body_bytes=8_000_000)
    with live_server(settings, fleet=fleet) as live:
        yield live


def image(data: bytes, kind: str = "image/png") -> dict[str, Any]:
    url = f"data:{kind};base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": url}


def pdf(data: bytes) -> dict[str, Any]:
    url = "data:application/pdf;base64," + base64.b64encode(data).decode()
    return {"type": "document_url", "document_url": url}


def ocr(server: Live, document: dict[str, Any], **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "document": document, **fields}
    return httpx.post(f"{server.url}/v1/ocr", json=body, timeout=60)


def test_a_rendered_english_page_is_read_in_order(server: Live) -> None:
    lines = ["The quick brown fox jumps over the lazy dog.", "Invoice total: 123.45 EUR"]
    answer = ocr(server, image(png_bytes(render_lines(lines, angle=2.0))))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    [page] = body["pages"]
    assert page["markdown"] == "\n".join(lines)
    assert page["source"] == "ocr" and page["index"] == 0
    assert [line["text"] for line in page["lines"]] == lines
    assert all(line["confidence"] > 0.8 for line in page["lines"])
    x0, y0, x1, y1 = page["lines"][0]["bbox"]
    assert 0 <= x0 < x1 <= page["dimensions"]["width"] and 0 <= y0 < y1
    assert body["model"] == MODEL and body["usage_info"]["pages_processed"] == 1
    assert answer.headers["x-model"] == MODEL
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    [listed] = [m for m in models if m["id"] == MODEL]
    assert listed["task"] == "ocr" and listed["state"] == "ready" and listed["kind"] == "ocr"


def test_a_pdf_with_a_text_layer_is_answered_from_it(server: Live, roots: Path) -> None:
    answer = ocr(server, pdf(text_pdf(["Hello from the text layer"])))
    [page] = answer.json()["pages"]
    assert page["source"] == "text_layer" and page["markdown"] == "Hello from the text layer"
    assert page["dimensions"] == {"dpi": 200, "height": 2200, "width": 1700}
    repaired = ocr(server, pdf(repairable_xref_pdf("Offsets all wrong")))  # PDFium rebuilds
    assert repaired.json()["pages"][0]["markdown"] == "Offsets all wrong"
    (roots / "letter.pdf").write_bytes(text_pdf(["From a local file"]))
    local = {"type": "document_url", "document_url": (roots / "letter.pdf").as_uri()}
    assert ocr(server, local).json()["pages"][0]["markdown"] == "From a local file"


def test_an_image_only_pdf_is_ocred_page_by_page(server: Live) -> None:
    scans = [render_lines(["Page one of the scan"]), render_lines(["Second page here"])]
    answer = ocr(server, pdf(image_pdf(scans)))
    assert answer.status_code == 200, answer.text
    pages = answer.json()["pages"]
    assert [p["markdown"] for p in pages] == ["Page one of the scan", "Second page here"]
    assert [p["source"] for p in pages] == ["ocr", "ocr"]
    only = ocr(server, pdf(image_pdf(scans)), pages=[1]).json()["pages"]
    assert [(p["index"], p["markdown"]) for p in only] == [(1, "Second page here")]


@pytest.mark.parametrize(
    ("document", "status", "words"),
    [
        (image(png_bytes(render_lines(["cut short"]))[:300]), 422, "truncated or corrupt"),
        (image(b""), 422, "empty (0 bytes)"),
        (image(huge_png_header(20_000, 20_000)), 413, "20000x20000"),
        (pdf(broken_xref_pdf()), 422, "the PDF cannot be opened"),
        ({"type": "document_url", "document_url": "https://example.com/a.pdf"}, 422,
         "not fetched"),
        ({"type": "document_url", "document_url": "/etc/passwd"}, 422, "outside the local roots"),
        ({"type": "video_url", "video_url": "x"}, 422, "document must be"),
    ],
)  # fmt: skip
def test_poison_is_a_clear_4xx_and_the_next_request_is_answered(
    server: Live, document: dict[str, Any], status: int, words: str
) -> None:
    answer = ocr(server, document)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["error"]["message"]
    good = ocr(server, image(png_bytes(render_lines(["Still here"]))))
    assert good.json()["pages"][0]["markdown"] == "Still here"


def test_the_gateway_refuses_before_queueing(server: Live) -> None:
    page = image(png_bytes(render_lines(["x"])))
    too_many = ocr(server, pdf(text_pdf(["a"])), pages=[0, 1, 2, 3, 4])
    assert too_many.status_code == 413 and "--ocr-max-pages" in too_many.text
    wrong = httpx.post(f"{server.url}/v1/ocr", json={"model": "all-minilm-l6-v2", "document": page})
    assert wrong.status_code == 400 and "cannot read documents" in wrong.text
    embed = httpx.post(f"{server.url}/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert embed.status_code == 400
