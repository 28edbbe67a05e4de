"""The labelled page set: the same pages from the same seed, and ground truth that
matches what is drawn (ink inside the line boxes, none outside)."""

from __future__ import annotations

import io
import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from bench.ocr_data import corpus, degrade, fonts, pageset
from bench.ocr_data.pageset import Sample


@pytest.fixture(scope="module")
def pages(gesetze: Path) -> list[Sample]:
    return pageset.build(12, seed=0, gesetze=gesetze)


def pixels(sample: Sample) -> np.ndarray:
    with Image.open(io.BytesIO(sample.png)) as image:
        assert image.size == (sample.width, sample.height)
        return np.asarray(image.convert("L"), dtype=np.int16)


def test_every_font_draws_the_german_letters_not_a_missing_glyph_box() -> None:
    for name in fonts.FONTS:
        font = ImageFont.truetype(str(fonts.font_path(name)), 24)
        missing = bytes(font.getmask("\ue000"))  # a private-use point: no font has it
        for ch in "äöüÄÖÜß§€„“":
            assert bytes(font.getmask(ch)) != missing, (name, ch)


def test_the_same_seed_gives_the_same_pages_and_a_longer_set_starts_with_them(
    pages: list[Sample], gesetze: Path
) -> None:
    again = pageset.build(12, seed=0, gesetze=gesetze)
    assert [s.truth() for s in again] == [s.truth() for s in pages]
    assert [s.png for s in again] == [s.png for s in pages]
    assert pageset.build(3, seed=0, gesetze=gesetze) == pages[:3]
    other = pageset.build(3, seed=1, gesetze=gesetze)
    assert [s.png for s in other] != [s.png for s in pages[:3]]
    assert [s.text for s in other] != [s.text for s in pages[:3]]


def test_twelve_pages_hold_every_condition_in_both_languages(
    pages: list[Sample], gesetze: Path
) -> None:
    combos = Counter((s.language, s.condition) for s in pages)
    assert set(combos) == {(lang, c) for lang in corpus.LANGUAGES for c in pageset.CONDITIONS}
    assert {s.layout for s in pages} == {"page", "receipt"}
    assert {s.layout for s in pageset.build(24, gesetze=gesetze)[12:]} == {"page", "two-column"}
    assert all(s.font in fonts.FONTS and s.size_px in pageset.SIZES_PX for s in pages)


def test_the_text_is_what_the_sources_hold(pages: list[Sample], gesetze: Path) -> None:
    german = [s for s in pages if s.language == "de" and s.layout == "page"]
    assert all(s.lines[0].text.startswith("§") for s in german)  # the section's heading
    assert any(ch in s.text for s in german for ch in "äöüß")
    by_id = {p.source: p for p in corpus.german(gesetze)}
    for s in german:
        body = " ".join(by_id[s.source].paragraphs)
        assert " ".join(line.text for line in s.lines[1:]) in body  # drawn in order, maybe cut
    english = [s for s in pages if s.language == "en" and s.layout == "page"]
    prose = " ".join(p.paragraphs[0] for p in corpus.english())
    for s in english:
        assert " ".join(line.text for line in s.lines) in prose
    assert all(line.text and line.text == line.text.strip() for s in pages for line in s.lines)
    assert all(s.text == "\n".join(line.text for line in s.lines) for s in pages)


def test_a_receipt_lists_items_with_prices_and_their_sum(pages: list[Sample]) -> None:
    for s in (s for s in pages if s.layout == "receipt"):
        amounts = [
            int(m.group(1) + m.group(2))
            for line in s.lines
            if (m := re.search(r"(\d+)[.,](\d\d)$", line.text))
        ]
        *items, total = amounts
        assert len(items) >= 6 and sum(items) == total
        price_right = [line.box[2] for line in s.lines if re.search(r"\d[.,]\d\d$", line.text)]
        assert max(price_right) - min(price_right) <= 2  # prices right-aligned


def test_two_columns_are_read_down_the_left_then_down_the_right(gesetze: Path) -> None:
    page = pageset.sample(0, 22, gesetze)
    assert page.layout == "two-column"
    body = page.lines[1:]  # the heading spans the page
    lefts = [line.box[0] for line in body]
    split = next(i for i, x in enumerate(lefts) if x > page.width / 3)
    assert split > 3 and all(x < page.width / 3 for x in lefts[:split])
    assert all(x > page.width / 3 for x in lefts[split:])
    assert body[split].box[1] < body[split - 1].box[1]  # the right column starts at the top


def test_ink_lies_inside_the_line_boxes_and_each_box_holds_ink(pages: list[Sample]) -> None:
    for s in pages:
        if s.condition not in ("clean", "layout", "rotated"):
            continue
        image = pixels(s)
        paper = int(np.median(image))
        dark = image < paper - 80
        inside = np.zeros_like(dark)
        for line in s.lines:
            x0, y0, x1, y1 = line.box
            assert 0 <= x0 < x1 <= s.width and 0 <= y0 < y1 <= s.height
            assert dark[y0:y1, x0:x1].mean() > 0.03, (s.id, line.text)
            pad = 3 if s.condition == "rotated" else 2  # bicubic resampling spreads ink a little
            inside[max(0, y0 - pad) : y1 + pad, max(0, x0 - pad) : x1 + pad] = True
        if s.layout == "receipt":  # its rule is drawn ink with no text
            continue
        assert not (dark & ~inside).any(), s.id


def test_a_rotated_box_still_holds_its_ink() -> None:
    image = Image.new("RGB", (400, 200), (255, 255, 255))
    box = (50, 80, 350, 110)
    ImageDraw.Draw(image).rectangle((box[0], box[1], box[2] - 1, box[3] - 1), fill=(0, 0, 0))
    for angle in (-4.0, 2.5):
        turned = image.rotate(angle, expand=True, fillcolor=(255, 255, 255))
        ink = np.argwhere(np.asarray(turned.convert("L")) < 128)
        found = (ink[:, 1].min(), ink[:, 0].min(), ink[:, 1].max() + 1, ink[:, 0].max() + 1)
        expected = degrade.rotate_box(box, angle, image.size, turned.size)
        assert all(abs(a - b) <= 2 for a, b in zip(found, expected, strict=True)), angle


def grey_share(image: np.ndarray) -> float:
    return float(((image > 60) & (image < 180)).mean())


def test_each_condition_degrades_a_page_the_way_it_is_named(gesetze: Path) -> None:
    page = pageset.sample(0, 0, gesetze)
    assert page.condition == "clean"
    with Image.open(io.BytesIO(page.png)) as opened:
        image = opened.convert("RGB")
    clean = pixels(page)

    def apply(condition: str) -> tuple[np.ndarray, tuple[int, int]]:
        out, lines = degrade.CONDITIONS[condition](image, page.lines, random.Random(5))
        assert len(lines) == len(page.lines)
        return np.asarray(out.convert("L"), dtype=np.int16), out.size

    noisy, _ = apply("noisy")
    assert np.std(noisy[clean > 200]) > 8 > np.std(clean[clean > 200])  # grainy paper
    blurred, _ = apply("blur")
    assert grey_share(blurred) > 1.5 * grey_share(clean)  # soft edges
    jpeg, _ = apply("jpeg")
    assert 0.5 < np.abs(jpeg - clean).mean() < 20  # artefacts, the text still there
    _, size = apply("rotated")
    assert size[0] > page.width and size[1] > page.height  # turned, and nothing cut off
    assert np.array_equal(apply("clean")[0], clean)


def test_the_set_is_written_with_its_truth(tmp_path: Path, pages: list[Sample]) -> None:
    truth = pageset.save(pages[:2], tmp_path)
    lines = truth.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and (tmp_path / f"{pages[0].id}.png").read_bytes() == pages[0].png
    assert '"§' in lines[0]  # umlauts and § kept as they are, not escaped


def test_a_missing_law_folder_says_which_flag_to_set(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--gesetze"):
        pageset.sample(0, 0, tmp_path / "nowhere")
