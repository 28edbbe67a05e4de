"""The character error rate: known values, its normalisation, the line matching and
how groups add up."""

from __future__ import annotations

import math

import pytest

from bench.ocr_data import pageset, score
from bench.ocr_data.render import Line
from bench.ocr_data.score import PageScore, PredictedLine, Prediction, Score


def test_known_values() -> None:
    assert score.score("kitten", "sitting") == Score(3, 6)
    assert score.cer("kitten", "sitting") == pytest.approx(0.5)
    assert score.cer("Rechtsfähigkeit", "Rechtsfahigkeit") == pytest.approx(1 / 15)
    assert score.cer("Größe", "GroBe") == pytest.approx(2 / 5)
    assert score.cer("abc", "") == 1.0
    assert score.cer("abc", "abcdef") == 1.0  # insertions count too: CER can pass 1
    assert score.cer("ab", "xyzw") == 2.0
    assert score.cer("", "") == 0.0
    assert math.isinf(score.cer("", "x"))


def test_whitespace_and_unicode_forms_do_not_count() -> None:
    assert score.cer("Die  Partei\nhat", " Die Partei hat\n") == 0.0
    assert score.cer("Mängel", "Ma\u0308ngel") == 0.0  # decomposed umlaut: the same letter
    assert score.cer("a b", "ab") == pytest.approx(1 / 3)  # a lost space is an error
    assert score.cer("Liberty, and", "Liberty， and") == pytest.approx(1 / 12)  # fullwidth comma


def sample(lines: list[Line]) -> pageset.Sample:
    return pageset.Sample(
        "t", "en", "page", "clean", "dejavu-sans", 20, "test", tuple(lines), b"", 400, 200
    )


TWO_LINES = sample([Line("first line", (10, 10, 200, 30)), Line("second one", (10, 50, 190, 70))])


def test_reading_order_counts_on_the_page_but_not_in_the_lines() -> None:
    swapped = Prediction(
        "second one\nfirst line",
        (
            PredictedLine("second one", (12, 48, 188, 72)),
            PredictedLine("first line", (8, 12, 202, 28)),
        ),
    )
    result = score.page_score(TWO_LINES, swapped)
    assert result.page.cer > 0.5 and result.lines == Score(0, 20)


def test_a_line_read_in_pieces_is_joined_left_to_right() -> None:
    receipt = sample([Line("Gurken 1,19", (10, 10, 390, 30))])
    pieces = (PredictedLine("1,19", (340, 10, 390, 30)), PredictedLine("Gurken", (10, 10, 90, 30)))
    assert score.line_score(receipt, Prediction("1,19 Gurken", pieces)) == Score(0, 11)


def test_stray_text_and_missed_lines_are_errors() -> None:
    stray = Prediction(
        "first line\nsecond one\nnoise",
        (
            PredictedLine("first line", (10, 10, 200, 30)),
            PredictedLine("second one", (10, 50, 190, 70)),
            PredictedLine("noise", (300, 150, 390, 190)),  # outside every truth box
        ),
    )
    assert score.line_score(TWO_LINES, stray) == Score(5, 20)
    missed = Prediction("first line", (PredictedLine("first line", (10, 10, 200, 30)),))
    assert score.line_score(TWO_LINES, missed) == Score(10, 20)


def test_overlapping_boxes_go_to_the_nearest_line() -> None:
    # rotated lines: their axis-aligned boxes overlap; each centre is nearer its own line
    boxes = [(0, 0, 400, 40), (0, 20, 400, 60)]
    lines = [PredictedLine("a", (0, 5, 400, 25)), PredictedLine("b", (0, 35, 400, 55))]
    assert score.assign(boxes, lines) == [0, 1]


def test_groups_add_characters_before_dividing() -> None:
    short = sample([Line("x" * 10, (0, 0, 10, 10))])
    long = pageset.Sample(
        **{**short.__dict__, "language": "de", "lines": (Line("y" * 90, (0, 0, 90, 10)),)}
    )
    scores = [
        PageScore(short, Score(1, 10), Score(1, 10)),
        PageScore(long, Score(9, 90), Score(0, 90)),
    ]
    summary = score.summary(scores)
    assert summary["all"] == {"pages": 2, "chars": 100, "cer": 0.1, "line_cer": 0.01}
    assert summary["language"]["en"]["cer"] == 0.1 and summary["language"]["de"]["line_cer"] == 0
    assert set(summary) == {"all", *score.GROUPS}
