"""The labelled OCR page set: deterministic from a seed, with its ground truth.

Sample ``i`` is drawn from its own generator, seeded by ``(seed, i)``, so a set
of ``n`` pages is the first ``n`` of any longer one and a page does not change
when the set grows. Languages alternate (German law, English prose), and each
pair of pages takes the next condition of ``CONDITIONS`` (clean, rotated,
noisy, blur, jpeg, layout): every 12 pages hold each condition in each
language. Font and size come from the sample's generator; ``layout`` pages
alternate receipts and two columns.

    python -m bench.ocr_data.pageset --pages 12 --out /tmp/ocr-pages

writes each page as PNG beside ``truth.jsonl`` (its text in reading order, line
boxes, language, condition, font) to look at.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageFont

from bench.ocr_data import corpus, degrade, fonts, render
from bench.ocr_data.render import Line

DEFAULT_GESETZE = Path("../shared/data/gesetze")
CONDITIONS = tuple(degrade.CONDITIONS)
SIZES_PX = (18, 20, 22, 26, 30)
RECEIPT_FONTS = ("dejavu-mono", "liberation-mono", "free-mono", "dejavu-sans", "liberation-sans")


@dataclass(frozen=True)
class Sample:
    id: str  # "p007-de-rotated"
    language: str
    layout: str  # page | two-column | receipt
    condition: str
    font: str
    size_px: int
    source: str  # where the text comes from: "bgb/§823", a work's title, "receipt"
    lines: tuple[Line, ...]  # in reading order
    png: bytes
    width: int
    height: int

    @property
    def text(self) -> str:
        """The ground truth in reading order, one line per line."""
        return "\n".join(line.text for line in self.lines)

    def truth(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "language": self.language,
            "layout": self.layout,
            "condition": self.condition,
            "font": self.font,
            "size_px": self.size_px,
            "source": self.source,
            "width": self.width,
            "height": self.height,
            "png_sha256": hashlib.sha256(self.png).hexdigest(),
            "text": self.text,
            "lines": [{"text": line.text, "box": list(line.box)} for line in self.lines],
        }


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", optimize=False, compress_level=6)
    return buffer.getvalue()


def sample(seed: int, index: int, gesetze: Path = DEFAULT_GESETZE) -> Sample:
    rng = random.Random(f"ocr-pages:{seed}:{index}")
    language = corpus.LANGUAGES[index % 2]
    condition = CONDITIONS[(index // 2) % len(CONDITIONS)]
    texts = corpus.passages(language, gesetze)
    if condition == "layout":
        layout = ("receipt", "two-column")[(index // (2 * len(CONDITIONS))) % 2]
    else:
        layout = "page"
    font_name = rng.choice(RECEIPT_FONTS if layout == "receipt" else tuple(fonts.FONTS))
    size = rng.choice(SIZES_PX[:3] if layout == "receipt" else SIZES_PX)
    font = ImageFont.truetype(str(fonts.font_path(font_name)), size)
    if layout == "receipt":
        source = "receipt"
        image, lines = render.receipt(
            corpus.receipt(language, rng), font, rng.randint(460, 540), rng
        )
    elif layout == "two-column":
        first = rng.randrange(len(texts))
        chosen = [texts[(first + k) % len(texts)] for k in range(4)]
        source = chosen[0].source
        width = rng.randint(1300, 1600)
        image, lines = render.two_column(chosen, font, width, rng.randint(10, 14), rng)
    else:
        passage = texts[rng.randrange(len(texts))]
        source = passage.source
        width = rng.randint(900, 1240)
        image, lines = render.page(passage, font, width, rng.randint(6, 14), rng)
    image, lines = degrade.CONDITIONS[condition](image, lines, rng)
    return Sample(
        id=f"p{index:03d}-{language}-{layout if condition == 'layout' else condition}",
        language=language,
        layout=layout,
        condition=condition,
        font=font_name,
        size_px=size,
        source=source,
        lines=lines,
        png=_png(image),
        width=image.width,
        height=image.height,
    )


def build(pages: int, seed: int = 0, gesetze: Path = DEFAULT_GESETZE) -> list[Sample]:
    return [sample(seed, i, gesetze) for i in range(pages)]


def save(samples: Sequence[Sample], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "truth.jsonl", "w", encoding="utf-8") as truth:
        for s in samples:
            (folder / f"{s.id}.png").write_bytes(s.png)
            truth.write(json.dumps(s.truth(), ensure_ascii=False) + "\n")
    return folder / "truth.jsonl"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ocr_data.pageset")
    parser.add_argument("--pages", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gesetze", type=Path, default=DEFAULT_GESETZE)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    path = save(build(args.pages, args.seed, args.gesetze), args.out)
    print(f"wrote {args.pages} pages and {path}")


if __name__ == "__main__":
    main()
