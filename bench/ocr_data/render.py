"""Known text drawn into page images, each line's ink box recorded.

Three layouts: ``page`` (one column, a heading and wrapped paragraphs),
``two-column`` (a heading across the page, then the text flowing down the left
column and on down the right one) and ``receipt`` (narrow, a centred header,
item names left and prices right-aligned, a rule, the total).

The ground truth is what was drawn, in reading order: a line is the text of
one ``draw.text`` call (or, on a receipt, an item row: name and price with one
space between), its box the ink bounds Pillow reports for it. A passage too
long for the page is cut at a line, and the cut text is not in the truth.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from bench.ocr_data import corpus

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in pixels, x1/y1 exclusive


@dataclass(frozen=True)
class Line:
    text: str
    box: Box


Font = ImageFont.FreeTypeFont


def wrap(paragraph: str, font: Font, width: float) -> list[str]:
    """Greedy word wrap to ``width`` pixels; a word wider than the line stands alone."""
    lines: list[str] = []
    current = ""
    for word in paragraph.split():
        candidate = f"{current} {word}" if current else word
        if current and font.getlength(candidate) > width:
            lines.append(current)
            current = word
        else:
            current = candidate
    if current:
        lines.append(current)
    return lines


@dataclass(frozen=True)
class _Text:
    x: float
    y: float
    text: str
    anchor: str = "ls"  # left, baseline; "rs": right-aligned; "ms": centred


class _Plan:
    """Texts placed before the image size is known; ``rows`` groups the texts that form
    one ground-truth line (a receipt row's name and price)."""

    def __init__(self) -> None:
        self.rows: list[list[_Text]] = []
        self.rules: list[tuple[float, float, float]] = []  # x0, x1, y of drawn rules

    def add(self, *texts: _Text) -> None:
        self.rows.append(list(texts))

    def render(
        self, font: Font, size: tuple[int, int], rng: random.Random
    ) -> tuple[Image.Image, tuple[Line, ...]]:
        paper = rng.randint(236, 255)
        ink = rng.randint(0, 48)
        image = Image.new("RGB", size, (paper, paper, paper - rng.randint(0, 6)))
        draw = ImageDraw.Draw(image)
        lines: list[Line] = []
        for row in self.rows:
            boxes = []
            for t in row:
                draw.text((t.x, t.y), t.text, font=font, fill=(ink, ink, ink), anchor=t.anchor)
                boxes.append(draw.textbbox((t.x, t.y), t.text, font=font, anchor=t.anchor))
            box = (
                int(min(b[0] for b in boxes)),
                int(min(b[1] for b in boxes)),
                int(max(b[2] for b in boxes)),
                int(max(b[3] for b in boxes)),
            )
            lines.append(Line(" ".join(t.text for t in row), box))
        for x0, x1, y in self.rules:
            draw.line([(x0, y), (x1, y)], fill=(ink, ink, ink), width=2)
        return image, tuple(lines)


def _leading(font: Font) -> float:
    ascent, descent = font.getmetrics()
    return 1.45 * (ascent + descent)


def page(
    passage: corpus.Passage, font: Font, width: int, max_lines: int, rng: random.Random
) -> tuple[Image.Image, tuple[Line, ...]]:
    margin = rng.randint(40, 90)
    lead = _leading(font)
    text_width = width - 2 * margin
    plan = _Plan()
    y: float = margin + font.getmetrics()[0]
    if passage.heading:
        for text in wrap(passage.heading, font, text_width):
            plan.add(_Text(margin, y, text))
            y += lead
        y += lead / 2
    for paragraph in passage.paragraphs:
        for text in wrap(paragraph, font, text_width):
            if len(plan.rows) >= max_lines:
                break
            plan.add(_Text(margin, y, text))
            y += lead
        y += lead / 2
    height = int(y - lead + font.getmetrics()[1] + margin)
    return plan.render(font, (width, height), rng)


def two_column(
    passages: Sequence[corpus.Passage],
    font: Font,
    width: int,
    lines_per_column: int,
    rng: random.Random,
) -> tuple[Image.Image, tuple[Line, ...]]:
    """The first passage's heading across the page, then the passages' paragraphs
    flowing through the left column and on into the right one."""
    margin, gutter = rng.randint(40, 70), rng.randint(40, 70)
    lead = _leading(font)
    column = (width - 2 * margin - gutter) / 2
    flow: list[str | None] = []  # None: a paragraph break
    for passage in passages:
        for paragraph in passage.paragraphs:
            flow.extend(wrap(paragraph, font, column))
            flow.append(None)
    plan = _Plan()
    y: float = margin + font.getmetrics()[0]
    heading = passages[0].heading or passages[0].source
    for text in wrap(heading, font, width - 2 * margin):
        plan.add(_Text(margin, y, text))
        y += lead
    top = bottom = y + lead / 2
    for x in (margin, margin + column + gutter):
        y, placed = top, 0
        while flow and placed < lines_per_column:
            item = flow.pop(0)
            if item is None:
                if placed:
                    y += lead / 2
                continue
            plan.add(_Text(x, y, item))
            y += lead
            placed += 1
        bottom = max(bottom, y)
    height = int(bottom - lead + font.getmetrics()[1] + margin)
    return plan.render(font, (width, height), rng)


def receipt(
    slip: corpus.Receipt, font: Font, width: int, rng: random.Random
) -> tuple[Image.Image, tuple[Line, ...]]:
    margin = rng.randint(20, 36)
    lead = _leading(font)
    plan = _Plan()
    y: float = margin + font.getmetrics()[0]
    for text in slip.header:
        plan.add(_Text(width / 2, y, text, "ms"))
        y += lead
    y += lead / 2
    for name, price in slip.items:
        plan.add(_Text(margin, y, name), _Text(width - margin, y, price, "rs"))
        y += lead
    plan.rules.append((margin, width - margin, y - lead / 2))
    y += lead / 2
    plan.add(_Text(margin, y, slip.total[0]), _Text(width - margin, y, slip.total[1], "rs"))
    y += 1.5 * lead
    plan.add(_Text(width / 2, y, slip.footer, "ms"))
    height = int(y + font.getmetrics()[1] + margin)
    return plan.render(font, (width, height), rng)
