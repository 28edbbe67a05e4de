"""Reading documents: each check before the step it guards, each failure a clear 4xx."""

from __future__ import annotations

import base64
import io
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from embedder.core.errors import InvalidRequest, LimitExceeded
from embedder.tasks.ocr.api import OcrLimits, OcrRequest
from embedder.tasks.ocr.documents import PageImage, PageLayer, header_size, read_document
from tests.embedder.tasks.ocr.samples import broken_xref_pdf, text_pdf


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(out, "PNG")
    return out.getvalue()


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.effect_noise((width, height), 64).convert("RGB").save(out, "JPEG")
    return out.getvalue()


def huge_png_header(width: int, height: int) -> bytes:
    """A PNG that claims a size and holds one tiny chunk of pixel data: its header is
    enough to refuse it, and decoding it would take width x height x 3 bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    idat = zlib.compress(b"\x00" * 1000)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def read(data: bytes, limits: OcrLimits | None = None, kind: str = "image_url") -> list:  # type: ignore[type-arg]
    url = "data:application/octet-stream;base64," + base64.b64encode(data).decode()
    return read_document(OcrRequest(kind, url, None), limits or OcrLimits())[1]  # type: ignore[arg-type]


def test_header_sizes_of_png_and_jpeg() -> None:
    assert header_size(png(31, 17)) == (31, 17)
    assert header_size(jpeg(40, 23)) == (40, 23)


def test_an_image_becomes_one_bgr_page() -> None:
    [page] = read(png(30, 20))
    assert isinstance(page, PageImage) and page.pixels.shape == (20, 30, 3)


@pytest.mark.parametrize(
    ("data", "error", "words"),
    [
        (b"", InvalidRequest, r"empty \(0 bytes\)"),
        (png(64, 64)[:60], InvalidRequest, "truncated or corrupt"),
        (jpeg(64, 64)[:400], InvalidRequest, "truncated or corrupt"),
        (b"hello world", InvalidRequest, "neither a PDF nor an image"),
        (huge_png_header(20_000, 20_000), LimitExceeded, "20000x20000"),
        (broken_xref_pdf(), InvalidRequest, "the PDF cannot be opened"),
    ],
)
def test_poison_documents_are_refused_with_their_reason(
    data: bytes, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        read(data)


def test_the_pixel_limit_is_checked_before_decoding() -> None:
    with pytest.raises(LimitExceeded, match="--ocr-max-pixels"):
        read(png(100, 100), OcrLimits(max_pixels=9_999))


def test_a_pdf_with_a_text_layer_is_read_without_rendering() -> None:
    [page] = read(text_pdf(["Hello from the text layer"]), kind="document_url")
    assert isinstance(page, PageLayer)
    assert [line.text for line in page.lines] == ["Hello from the text layer"]
    assert page.width == round(612 * 200 / 72)


def test_pages_out_of_range_and_over_the_limit() -> None:
    pdf = base64.b64encode(text_pdf(["a", "b"], pages=2)).decode()
    url = "data:application/pdf;base64," + pdf
    with pytest.raises(InvalidRequest, match="has 2 pages"):
        read_document(OcrRequest("document_url", url, (5,)), OcrLimits())
    with pytest.raises(LimitExceeded, match="--ocr-max-pages"):
        read_document(OcrRequest("document_url", url, None), OcrLimits(max_pages=1))


def test_urls_and_paths(tmp_path: Path) -> None:
    inside = tmp_path / "scan.png"
    inside.write_bytes(png(10, 10))
    limits = OcrLimits(local_roots=(tmp_path,))
    for url in (str(inside), inside.as_uri()):
        assert read_document(OcrRequest("document_url", url, None), limits)[0] > 0
    with pytest.raises(InvalidRequest, match="not fetched"):
        read_document(OcrRequest("document_url", "https://example.com/a.pdf", None), limits)
    with pytest.raises(InvalidRequest, match="outside the local roots"):
        read_document(OcrRequest("document_url", f"{tmp_path}/../etc/passwd", None), limits)
    with pytest.raises(InvalidRequest, match="--ocr-local-roots"):
        read_document(OcrRequest("document_url", str(inside), None), OcrLimits())
    with pytest.raises(LimitExceeded, match="--ocr-max-document-bytes"):
        read_document(OcrRequest("document_url", str(inside), None), OcrLimits(
            max_document_bytes=10, local_roots=(tmp_path,)))  # fmt: skip
