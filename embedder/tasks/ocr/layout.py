"""Reading order: a page's lines as blocks of rows, top to bottom, columns left to right.

A line wider than ``WIDE`` of the page (a title, a paragraph across the page) separates
sections; within a section the lines' horizontal extents are merged, and where they
leave a vertical gap the section is split into columns, read one after the other. A
split is kept only when every column has several lines and they are text-like (their
median width at least ``COLUMN`` of the page): a receipt's narrow prices on the right
are not a column of their own but the ends of rows, nor is the second half of one line.
Within a block, boxes whose vertical centres fall inside a row's span share that row and
are read left to right. Pure: no I/O, no clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from embedder.tasks.ocr.api import Line

WIDE = 0.55  # a line over this share of the page width spans the columns
COLUMN = 0.2  # each column's lines are at least this wide (median), or there is no split

Row = tuple[Line, ...]
Block = tuple[Row, ...]


def reading_order(lines: Sequence[Line], page_width: float) -> tuple[Block, ...]:
    ordered = sorted(lines, key=_centre_y)
    blocks: list[Block] = []
    section: list[Line] = []
    for line in ordered:
        x0, _, x1, _ = line.bbox
        if x1 - x0 > WIDE * page_width:
            blocks += _columns(section, page_width)
            section = []
            if blocks and _is_wide_block(blocks[-1], page_width):
                blocks[-1] = _rows([line for row in blocks[-1] for line in row] + [line])
            else:
                blocks.append(_rows([line]))
        else:
            section.append(line)
    blocks += _columns(section, page_width)
    return tuple(blocks)


def _centre_y(line: Line) -> float:
    _, y0, _, y1 = line.bbox
    return (y0 + y1) / 2


def _is_wide_block(block: Block, page_width: float) -> bool:
    return all(line.bbox[2] - line.bbox[0] > WIDE * page_width for row in block for line in row)


def _columns(lines: list[Line], page_width: float) -> list[Block]:
    if not lines:
        return []
    spans: list[list[float]] = []  # merged horizontal extents, left to right
    for x0, x1 in sorted((line.bbox[0], line.bbox[2]) for line in lines):
        if spans and x0 <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], x1)
        else:
            spans.append([x0, x1])
    columns: list[list[Line]] = [[] for _ in spans]
    for line in lines:
        at = next(i for i, (x0, x1) in enumerate(spans) if x0 <= line.bbox[0] <= x1)
        columns[at].append(line)
    text_like = all(
        len(column) >= 2
        and statistics.median(line.bbox[2] - line.bbox[0] for line in column) >= COLUMN * page_width
        for column in columns
    )
    if len(columns) == 1 or not text_like:
        return [_rows(lines)]
    return [_rows(column) for column in columns]


def _rows(lines: list[Line]) -> Block:
    rows: list[tuple[float, float, list[Line]]] = []  # (top, bottom, lines)
    for line in sorted(lines, key=_centre_y):
        _, y0, _, y1 = line.bbox
        centre = (y0 + y1) / 2
        if rows and rows[-1][0] <= centre <= rows[-1][1]:
            rows[-1][2].append(line)
        else:
            rows.append((y0, y1, [line]))
    return tuple(tuple(sorted(row, key=lambda line: line.bbox[0])) for _, _, row in rows)
