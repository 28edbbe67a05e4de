"""From an OCR request to page images (or to a PDF page's own text): where the worker
reads and decodes what the gateway only annotated.

Every check runs before the expensive step it guards: the encoded size before base64 is
decoded, a file's size before it is read, an image's pixel count from its header before
its pixels are decoded, a PDF page's text layer before it is rendered. What cannot be
read is an ``InvalidRequest`` (422) that says what was wrong; what is over a limit is a
``LimitExceeded`` (413) naming the flag. PDFium is not thread-safe: call this from one
thread (the OCR engine's host thread).
"""

from __future__ import annotations

import binascii
import io
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pypdfium2
from numpy.typing import NDArray
from PIL import Image, ImageOps, UnidentifiedImageError

from embedder.core.errors import InvalidRequest, LimitExceeded
from embedder.tasks.ocr.api import BASE64_RATIO, Line, OcrLimits, OcrRequest

PDF_POINTS_PER_INCH = 72.0


@dataclass(frozen=True, slots=True)
class PageImage:
    """A page to OCR: BGR pixels, as PaddleOCR's models were trained on."""

    index: int
    pixels: NDArray[np.uint8]  # (height, width, 3)
    dpi: float | None  # None for an image, whose resolution is not known


@dataclass(frozen=True, slots=True)
class PageLayer:
    """A PDF page answered from its own text layer: its runs of text with their boxes."""

    index: int
    width: int
    height: int
    dpi: float
    lines: tuple[Line, ...]


Page = PageImage | PageLayer


def read_document(request: OcrRequest, limits: OcrLimits) -> tuple[int, list[Page]]:
    """The document's size in bytes and its pages (the ones asked for, in that order)."""
    data = document_bytes(request.url, limits)
    if not data:
        raise InvalidRequest("the document is empty (0 bytes): send an image or a PDF")
    if b"%PDF-" in data[:1024]:
        return len(data), pdf_pages(data, request.pages, limits)
    if request.pages not in (None, (0,)):
        raise InvalidRequest(f"an image has one page (0); pages {list(request.pages or ())}")
    return len(data), [PageImage(0, image_pixels(data, limits), None)]


# -- bytes -------------------------------------------------------------------------------


def _too_big(size: int, limits: OcrLimits) -> LimitExceeded:
    return LimitExceeded(
        f"the document has {size} bytes, over the limit of {limits.max_document_bytes}: "
        "send a smaller one, or raise --ocr-max-document-bytes "
        "(FLOTILLA_OCR_MAX_DOCUMENT_BYTES)"
    )


def document_bytes(url: str, limits: OcrLimits) -> bytes:
    if url.startswith("data:"):
        header, comma, payload = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise InvalidRequest(
                f"a data: URL must be base64: data:<type>;base64,<data> (got {header[:60]!r}...)"
            )
        return _base64(payload, limits)
    parsed = urlparse(url)
    if parsed.scheme in ("http", "https", "ftp", "s3", "gs"):
        raise InvalidRequest(
            f"{parsed.scheme}:// URLs are not fetched: send the document as a data: URL "
            "(base64), or as a file path under --ocr-local-roots"
        )
    if parsed.scheme == "file" or url.startswith(("/", "./", "~")):
        return _local_file(unquote(parsed.path) if parsed.scheme == "file" else url, limits)
    return _base64(url, limits)  # Mistral's clients also send bare base64


def _base64(payload: str, limits: OcrLimits) -> bytes:
    approx = int(len(payload) * BASE64_RATIO)
    if approx > limits.max_document_bytes:
        raise _too_big(approx, limits)
    try:
        return binascii.a2b_base64(payload.strip(), strict_mode=True)
    except binascii.Error as exc:
        raise InvalidRequest(f"the document's base64 is invalid: {exc}") from None


def _local_file(path: str, limits: OcrLimits) -> bytes:
    if not limits.local_roots:
        raise InvalidRequest(
            "file paths are not served here: send the document as a data: URL, or start "
            "the worker with --ocr-local-roots (FLOTILLA_OCR_LOCAL_ROOTS)"
        )
    target = Path(path).expanduser().resolve()  # symlinks and .. resolved before the check
    roots = [root.expanduser().resolve() for root in limits.local_roots]
    if not any(target.is_relative_to(root) for root in roots):
        raise InvalidRequest(
            f"{path} is outside the local roots ({', '.join(map(str, roots))}): only files "
            "under --ocr-local-roots are read"
        )
    try:
        size = target.stat().st_size
        if size > limits.max_document_bytes:
            raise _too_big(size, limits)
        return target.read_bytes()
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise InvalidRequest(f"cannot read {path}: {exc.strerror}") from None


# -- images ------------------------------------------------------------------------------


def header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's or JPEG's header without decoding it; None for other
    formats (or a header too broken to say), which PIL then reads lazily."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                i += 2
                continue
            length = struct.unpack(">H", data[i + 2 : i + 4])[0]
            # Start-of-frame markers (not DHT C4, JPG C8 or DAC CC) carry the size.
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height, width = struct.unpack(">HH", data[i + 5 : i + 9])
                return int(width), int(height)
            i += 2 + length
    return None


def _check_pixels(width: int, height: int, limits: OcrLimits) -> None:
    if width * height > limits.max_pixels:
        raise LimitExceeded(
            f"the image is {width}x{height} = {width * height} pixels, over the limit of "
            f"{limits.max_pixels}: scale it down, or raise --ocr-max-pixels "
            "(FLOTILLA_OCR_MAX_PIXELS)"
        )


def image_pixels(data: bytes, limits: OcrLimits) -> NDArray[np.uint8]:
    size = header_size(data)
    if size is not None:
        _check_pixels(*size, limits)
    try:
        with warnings.catch_warnings():
            # Our own pixel limit is checked below, before any pixel is decoded.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data))
            _check_pixels(*opened.size, limits)
            opened.load()
            image = ImageOps.exif_transpose(opened).convert("RGB")
    except Image.DecompressionBombError:
        raise LimitExceeded(
            f"the image has far more pixels than the limit of {limits.max_pixels}: scale "
            "it down, or raise --ocr-max-pixels (FLOTILLA_OCR_MAX_PIXELS)"
        ) from None
    except UnidentifiedImageError:
        raise InvalidRequest(
            f"the document is neither a PDF nor an image format this server reads "
            f"(it starts with {data[:8]!r}): send PNG, JPEG, WebP, TIFF, BMP, GIF or PDF"
        ) from None
    except (OSError, SyntaxError, ValueError) as exc:  # what PIL raises on broken files
        raise InvalidRequest(f"the image cannot be decoded (truncated or corrupt): {exc}") from None
    rgb = np.asarray(image, dtype=np.uint8)
    return np.ascontiguousarray(rgb[:, :, ::-1])


# -- PDFs --------------------------------------------------------------------------------


def pdf_pages(data: bytes, asked: tuple[int, ...] | None, limits: OcrLimits) -> list[Page]:
    try:
        pdf = pypdfium2.PdfDocument(data)
    except pypdfium2.PdfiumError as exc:
        raise InvalidRequest(
            f"the PDF cannot be opened ({exc}): its structure (cross-reference table, "
            "trailer) is broken beyond repair, it is encrypted, or it is not a PDF"
        ) from None
    try:
        count = len(pdf)
        indices = list(asked) if asked is not None else list(range(count))
        missing = [i for i in indices if i >= count]
        if missing:
            raise InvalidRequest(f"the PDF has {count} pages (0-{count - 1}); no page {missing}")
        if len(indices) > limits.max_pages:
            raise LimitExceeded(
                f"the PDF has {len(indices)} pages to read, over the limit of "
                f"{limits.max_pages}: ask for some with 'pages', or raise --ocr-max-pages "
                "(FLOTILLA_OCR_MAX_PAGES)"
            )
        return [_pdf_page(pdf, i, limits) for i in indices]
    finally:
        pdf.close()


def _pdf_page(pdf: pypdfium2.PdfDocument, index: int, limits: OcrLimits) -> Page:
    page = pdf[index]
    try:
        width_pt, height_pt = page.get_size()
        # A page too large for the pixel limit at the configured resolution is rendered
        # at a lower one: its text is still there, only smaller.
        fits = (limits.max_pixels / max(1.0, width_pt * height_pt)) ** 0.5 * PDF_POINTS_PER_INCH
        dpi = min(limits.pdf_dpi, fits)
        scale = dpi / PDF_POINTS_PER_INCH
        lines = _text_layer(page, height_pt, scale)
        if lines:
            width, height = round(width_pt * scale), round(height_pt * scale)
            return PageLayer(index, width, height, dpi, lines)
        bitmap = page.render(scale=scale)
        pixels = bitmap.to_numpy()[:, :, :3]  # PDFium renders BGR(x)
        return PageImage(index, np.ascontiguousarray(pixels), dpi)
    except pypdfium2.PdfiumError as exc:
        raise InvalidRequest(f"page {index} of the PDF cannot be read: {exc}") from None
    finally:
        page.close()


def _text_layer(page: pypdfium2.PdfPage, height_pt: float, scale: float) -> tuple[Line, ...]:
    """The page's runs of text with their boxes in pixels (origin top-left); none when it
    has no text layer (a scan) or only whitespace in it."""
    text = page.get_textpage()
    try:
        if not text.get_text_range().strip():
            return ()
        lines = []
        for i in range(text.count_rects()):
            left, bottom, right, top = text.get_rect(i)
            run = text.get_text_bounded(left, bottom, right, top).strip()
            if not run:
                continue
            x0, x1 = left * scale, right * scale
            y0, y1 = (height_pt - top) * scale, (height_pt - bottom) * scale
            lines.append(Line(run, 1.0, ((x0, y0), (x1, y0), (x1, y1), (x0, y1))))
        return tuple(lines)
    finally:
        text.close()
