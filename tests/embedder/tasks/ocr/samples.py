"""Documents made in the test: rendered text lines, PDFs with and without a text layer,
and broken ones. Fonts are Debian's DejaVu (fonts-dejavu-core)."""

from __future__ import annotations

import io
from collections.abc import Sequence

import pypdfium2
from PIL import Image, ImageDraw, ImageFont

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"


def render_lines(
    lines: Sequence[str], *, width: int = 1100, size: int = 26, angle: float = 0.0
) -> Image.Image:
    font = ImageFont.truetype(FONT, size)
    step = int(size * 2.2)
    image = Image.new("RGB", (width, step * len(lines) + 2 * size), "white")
    draw = ImageDraw.Draw(image)
    for i, text in enumerate(lines):
        draw.text((40, size + step * i), text, font=font, fill="black")
    return image.rotate(angle, expand=True, fillcolor="white") if angle else image


def png_bytes(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def text_pdf(texts: Sequence[str], pages: int = 1) -> bytes:
    """A PDF written by hand whose pages carry ``texts[i]`` in their text layer."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(pages)).encode()
    objects.append(b"<< /Type /Pages /Kids [" + kids + b"] /Count %d >>" % pages)
    font = 3 + 2 * pages
    for i in range(pages):
        content = b"BT /F1 24 Tf 72 720 Td (" + texts[i].encode("latin-1") + b") Tj ET"
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
            b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (4 + 2 * i, font)
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return out


def broken_xref_pdf() -> bytes:
    """A PDF whose cross-reference table and trailer are garbage: PDFium cannot rebuild
    it (it repairs mere wrong offsets, see ``repairable_xref_pdf``)."""
    good = text_pdf(["lost"])
    return good[: good.index(b"xref")] + b"xref\ngarbage\ntrailer\n<< >>\nstartxref\n99999\n%%EOF\n"


def repairable_xref_pdf(text: str) -> bytes:
    """Every cross-reference offset wrong: PDFium rebuilds the table from the objects."""
    good = text_pdf([text])
    head, _, tail = good.partition(b"xref\n")
    entries = tail.split(b"\n")
    fixed = [e.replace(e[:10], b"0000000001", 1) if e.endswith(b" n ") else e for e in entries]
    return head + b"xref\n" + b"\n".join(fixed)


def image_pdf(images: Sequence[Image.Image], dpi: float = 150.0) -> bytes:
    """A PDF of scanned pages: each page one image, no text layer."""
    pdf = pypdfium2.PdfDocument.new()
    for image in images:
        width_pt, height_pt = image.width * 72 / dpi, image.height * 72 / dpi
        page = pdf.new_page(width_pt, height_pt)
        picture = pypdfium2.PdfImage.new(pdf)
        picture.set_bitmap(pypdfium2.PdfBitmap.from_pil(image))
        picture.set_matrix(pypdfium2.PdfMatrix().scale(width_pt, height_pt))
        page.insert_obj(picture)
        page.gen_content()
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()
