"""Passages of a document read by OCR: each page split alone, numbered through the document,
each passage knowing its page, its lines and their box."""

from __future__ import annotations

from ingest.chunking import Passage, PassageSplitter, TokenWindow, line_spans, page_passages
from ingest.reading import PageLine, ReadPage, pages_of

# One token a word, plus two for the special tokens: a passage holds ten words.
WINDOW = TokenWindow(max_tokens=12, count=lambda text: len(text.split()) + 2)


def page(index: int, rows: list[list[str]], blocks: int = 1) -> ReadPage:
    """A page whose rows of lines are laid out as /v1/ocr's markdown is: a row's lines
    joined by a space, rows by a line break (one block)."""
    lines, y = [], 0.0
    for row in rows:
        for x, text in enumerate(row):
            lines.append(PageLine(text, (100.0 * x, y, 100.0 * x + 90, y + 20)))
        y += 30
    markdown = "\n".join(" ".join(row) for row in rows)
    return ReadPage(index, markdown, tuple(lines), "ocr")


def split(text: str) -> list[Passage]:
    return PassageSplitter(WINDOW).split(text)


def test_a_passage_never_spans_pages_and_the_numbering_runs_through() -> None:
    pages = [page(0, [["one two three"]]), page(1, [["four five"]]), page(2, [["six"]])]
    parts = page_passages(split, pages)
    assert [(p.index, p.page, p.text) for p in parts] == [
        (0, 0, "one two three"),
        (1, 1, "four five"),
        (2, 2, "six"),
    ]  # all three would fit one passage: pages still part them


def test_a_long_page_splits_into_passages_that_know_their_lines_and_box() -> None:
    rows = [[f"Sentence {r} has five words."] for r in range(6)]  # 30 words, 6 lines
    [only] = [page(4, rows)]
    parts = page_passages(split, [only])
    assert len(parts) == 3 and all(p.page == 4 for p in parts)
    assert [(p.line_start, p.line_end) for p in parts] == [(0, 2), (2, 4), (4, 6)]
    for part in parts:
        assert part.text == only.markdown[part.start : part.end]
        held = only.lines[part.line_start : part.line_end]  # type: ignore[misc]
        assert part.text == "\n".join(line.text for line in held)
        assert part.bbox == (0.0, held[0].bbox[1], 90.0, held[-1].bbox[3])


def test_line_spans_find_each_line_in_the_page_text_even_when_words_repeat() -> None:
    rows = [["total", "total"], ["total 5"]]
    spans = line_spans(page(0, rows))
    assert spans == [(0, 5), (6, 11), (12, 19)]


def test_blank_pages_make_no_passages() -> None:
    pages = [page(0, []), page(1, [["  "]]), page(2, [["text here"]])]
    assert [(p.index, p.page) for p in page_passages(split, pages)] == [(0, 2)]


def test_a_v1_ocr_answer_reads_as_pages() -> None:
    body = (
        b'{"pages": [{"index": 2, "markdown": "A b\\n\\nC", "source": "text_layer", "images": [],'
        b' "lines": [{"text": "A", "confidence": 1.0, "bbox": [1, 2, 3, 4], "polygon": []},'
        b' {"text": "b", "confidence": 0.9, "bbox": [5, 2, 7, 4], "polygon": []},'
        b' {"text": "C", "confidence": 0.9, "bbox": [1, 9, 3, 12], "polygon": []}]}],'
        b' "model": "m", "usage_info": {}}'
    )
    [read] = pages_of(body)
    assert (read.index, read.source, read.markdown) == (2, "text_layer", "A b\n\nC")
    assert [line.text for line in read.lines] == ["A", "b", "C"]
    assert line_spans(read) == [(0, 1), (2, 3), (5, 6)]
