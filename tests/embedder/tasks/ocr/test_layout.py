"""Reading order: rows top to bottom, columns left to right, receipts row by row."""

from __future__ import annotations

from embedder.tasks.ocr.api import Line, PageText
from embedder.tasks.ocr.layout import reading_order


def box(text: str, x0: float, y0: float, x1: float, y1: float) -> Line:
    return Line(text, 0.9, ((x0, y0), (x1, y0), (x1, y1), (x0, y1)))


def texts(lines: list[Line], width: float = 1000) -> list[list[str]]:
    return [
        [" ".join(x.text for x in row) for row in block] for block in reading_order(lines, width)
    ]


def test_two_columns_read_one_after_the_other_under_a_title() -> None:
    lines = [
        box("right 2", 520, 160, 960, 190),
        box("left 1", 40, 100, 480, 130),
        box("Title across the page", 40, 20, 960, 60),
        box("right 1", 520, 100, 960, 130),
        box("left 2", 40, 160, 480, 190),
        box("Footer across the page", 40, 400, 960, 430),
    ]
    assert texts(lines) == [
        ["Title across the page"],
        ["left 1", "left 2"],
        ["right 1", "right 2"],
        ["Footer across the page"],
    ]


def test_a_receipt_reads_row_by_row() -> None:
    lines = [
        box("1.20", 800, 100, 880, 130),
        box("Milk", 40, 102, 160, 132),
        box("Bread", 40, 150, 180, 180),
        box("2.50", 800, 148, 880, 178),
    ]
    assert texts(lines) == [["Milk 1.20", "Bread 2.50"]]


def test_a_slightly_rotated_line_split_in_two_boxes_stays_one_row() -> None:
    lines = [box("world", 300, 108, 500, 140), box("hello", 40, 100, 280, 132)]
    assert texts(lines) == [["hello world"]]


def test_markdown_separates_blocks_with_a_blank_line() -> None:
    lines = [box("Title across the page", 40, 20, 960, 60), box("a", 40, 100, 480, 130)]
    page = PageText(0, 1000, 500, None, "ocr", reading_order(lines, 1000))
    assert page.markdown == "Title across the page\n\na"
