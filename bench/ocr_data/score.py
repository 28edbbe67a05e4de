"""Character error rate of OCR output against the page set's ground truth.

CER = Levenshtein distance (insertions, deletions, substitutions) / reference
length, both texts in Unicode NFC with every run of whitespace (line breaks
included) made one space and the ends stripped: a line break where the truth
has a space, or a receipt's name and price read as two lines, costs nothing.
Groups of pages add edits and reference characters before dividing (a long
page weighs more than a short one), so a group's CER is the share of its
characters that came out wrong.

Two figures per page:

- ``page``: the whole text in the order the OCR gave it, against the truth in
  reading order; a two-column page read across the columns scores badly here.
- ``lines``: reading order left out. Each predicted line goes to the truth line
  whose box holds its box's centre (the nearest such centre when boxes overlap,
  as on rotated pages); a truth line is scored against its predicted lines
  joined left to right, and predicted text that lands in no truth box counts as
  inserted characters.
"""

from __future__ import annotations

import unicodedata
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rapidfuzz.distance import Levenshtein

from bench.ocr_data.pageset import Sample
from bench.ocr_data.render import Box


@dataclass(frozen=True)
class PredictedLine:
    text: str
    box: Box  # axis-aligned bounds in pixels of the page
    confidence: float | None = None


@dataclass(frozen=True)
class Prediction:
    text: str  # the page's text in the order the OCR gives it
    lines: tuple[PredictedLine, ...]


@dataclass(frozen=True)
class Score:
    edits: int
    chars: int  # of the normalised reference

    @property
    def cer(self) -> float:
        if self.chars:
            return self.edits / self.chars
        return 0.0 if self.edits == 0 else float("inf")

    def __add__(self, other: Score) -> Score:
        return Score(self.edits + other.edits, self.chars + other.chars)


def normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFC", text).split())


def score(reference: str, hypothesis: str) -> Score:
    ref, hyp = normalise(reference), normalise(hypothesis)
    return Score(Levenshtein.distance(ref, hyp), len(ref))


def cer(reference: str, hypothesis: str) -> float:
    return score(reference, hypothesis).cer


def _centre(box: Box) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def _distance(box: Box, x: float, y: float) -> float:
    cx, cy = _centre(box)
    return abs(cy - y) * 4 + abs(cx - x)  # a line is wide: height decides first


def assign(truth_boxes: Sequence[Box], predicted: Sequence[PredictedLine]) -> list[int | None]:
    """For each predicted line, the index of the truth box it belongs to, or None."""
    owners: list[int | None] = []
    for line in predicted:
        x, y = _centre(line.box)
        inside = [i for i, b in enumerate(truth_boxes) if b[0] <= x <= b[2] and b[1] <= y <= b[3]]
        if not inside:
            owners.append(None)
            continue

        owners.append(min(inside, key=lambda i: _distance(truth_boxes[i], x, y)))
    return owners


def line_score(sample: Sample, prediction: Prediction) -> Score:
    owners = assign([line.box for line in sample.lines], prediction.lines)
    pieces: dict[int, list[PredictedLine]] = defaultdict(list)
    stray = 0
    for line, owner in zip(prediction.lines, owners, strict=True):
        if owner is None:
            stray += len(normalise(line.text))
        else:
            pieces[owner].append(line)
    total = Score(stray, 0)
    for i, truth in enumerate(sample.lines):
        found = sorted(pieces.get(i, []), key=lambda p: p.box[0])
        total += score(truth.text, " ".join(p.text for p in found))
    return total


@dataclass(frozen=True)
class PageScore:
    sample: Sample
    page: Score
    lines: Score


def page_score(sample: Sample, prediction: Prediction) -> PageScore:
    return PageScore(sample, score(sample.text, prediction.text), line_score(sample, prediction))


GROUPS: dict[str, Callable[[Sample], str]] = {
    "language": lambda s: s.language,
    "condition": lambda s: s.condition,
    "layout": lambda s: s.layout,
    "font": lambda s: s.font,
    "size_px": lambda s: str(s.size_px),
}


def summary(scores: Iterable[PageScore]) -> dict[str, Any]:
    """Overall CER and CER per language, condition, layout, font and size."""
    scores = list(scores)

    def cell(group: Sequence[PageScore]) -> dict[str, Any]:
        page = sum((s.page for s in group), Score(0, 0))
        lines = sum((s.lines for s in group), Score(0, 0))
        return {
            "pages": len(group),
            "chars": page.chars,
            "cer": round(page.cer, 5),
            "line_cer": round(lines.cer, 5),
        }

    out: dict[str, Any] = {"all": cell(scores)}
    for name, key in GROUPS.items():
        groups: dict[str, list[PageScore]] = defaultdict(list)
        for s in scores:
            groups[key(s.sample)].append(s)
        out[name] = {k: cell(v) for k, v in sorted(groups.items())}
    return out
