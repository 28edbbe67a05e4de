"""The known text the OCR pages are rendered from.

German: ``§`` sections of the federal laws in ``gesetze/*.md`` (read where they
lie, through ``lora.gesetze``; never copied into the repo), each as its heading
line ("§ 1 Beginn der Rechtsfähigkeit") and its body. English: the
public-domain passages of ``english.txt`` beside this module. Receipts: item
names and prices drawn from the small lists below.

Only text every font of ``bench.ocr_data.fonts`` can draw is kept (``DRAWABLE``),
so no page shows a missing-glyph box whose ground truth is a letter.
"""

from __future__ import annotations

import functools
import random
import string
from dataclasses import dataclass
from pathlib import Path

ENGLISH = Path(__file__).with_name("english.txt")
LANGUAGES = ("de", "en")
DRAWABLE = frozenset(string.ascii_letters + string.digits + " .,;:!?'\"()[]/-+*%&=<>§$€£")
DRAWABLE |= frozenset("äöüÄÖÜßéèàçñ„“”‚‘’–—…°")
MIN_CHARS, MAX_CHARS = 160, 1400


@dataclass(frozen=True)
class Passage:
    language: str  # de | en
    source: str  # "bgb/§1" or the work it comes from
    heading: str  # drawn as the first line; "" when none
    paragraphs: tuple[str, ...]


def drawable(text: str) -> bool:
    return all(ch in DRAWABLE for ch in text)


@functools.cache
def english() -> tuple[Passage, ...]:
    passages: list[Passage] = []
    source = ""
    for block in ENGLISH.read_text(encoding="utf-8").split("\n\n"):
        lines = [line for line in block.strip().splitlines() if line.strip()]
        for line in lines:
            if line.startswith("#"):
                source = line.lstrip("# ").strip()
            elif drawable(line):
                passages.append(Passage("en", source, "", (line.strip(),)))
    return tuple(passages)


@functools.cache
def german(folder: Path) -> tuple[Passage, ...]:
    """Every section of the laws in ``folder`` short enough for a page and drawable."""
    from lora.gesetze import read_laws

    if not folder.is_dir():
        raise FileNotFoundError(
            f"no German laws at {folder}: pass --gesetze with the folder of gesetze/*.md"
        )
    passages: list[Passage] = []
    for law in read_laws(folder):
        for section in law.sections:
            heading = f"{section.number} {section.title}"
            paragraphs = tuple(p.strip() for p in section.body.splitlines() if p.strip())
            size = len(heading) + sum(len(p) for p in paragraphs)
            if MIN_CHARS <= size <= MAX_CHARS and drawable(heading + "".join(paragraphs)):
                passages.append(Passage("de", section.id, heading, paragraphs))
    if not passages:
        raise FileNotFoundError(f"{folder} holds no law sections (gesetze/*.md)")
    return tuple(passages)


def passages(language: str, gesetze: Path) -> tuple[Passage, ...]:
    if language == "de":
        return german(gesetze)
    if language == "en":
        return english()
    raise ValueError(f"unknown language {language!r}; known: {', '.join(LANGUAGES)}")


# -- receipts ------------------------------------------------------------------

_ITEMS = {
    "de": (
        "Vollkornbrot",
        "Äpfel Elstar 1 kg",
        "Käse Gouda jung",
        "Müsli Früchte",
        "Süßkartoffeln",
        "Brötchen 6 Stück",
        "Frische Vollmilch 3,5 %",
        "Kaffee gemahlen",
        "Öko-Eier 10er",
        "Weißwein trocken",
        "Gurken",
        "Bio-Möhren",
        "Sahnejoghurt",
        "Nudeln Spätzle",
        "Pfandrückgabe",
    ),
    "en": (
        "Whole wheat bread",
        "Apples Gala 2 lb",
        "Cheddar cheese",
        "Orange juice 1 l",
        "Sweet potatoes",
        "Bagels 6 pack",
        "Ground coffee",
        "Free range eggs",
        "Red wine",
        "Cucumbers",
        "Carrots organic",
        "Greek yogurt",
        "Spaghetti",
        "Bottle deposit",
        "Peanut butter",
    ),
}
_SHOPS = {
    "de": ("Bäckerei & Markt Müller", "Hauptstraße 12, 80331 München"),
    "en": ("Corner Street Grocery", "12 High Street, Oxford OX1 4AB"),
}

_THANKS = {"de": "Vielen Dank für Ihren Einkauf!", "en": "Thank you for shopping with us!"}


@dataclass(frozen=True)
class Receipt:
    language: str
    header: tuple[str, ...]  # shop, address, date: centred
    items: tuple[tuple[str, str], ...]  # (name, price) rows
    total: tuple[str, str]
    footer: str


def price(cents: int, language: str) -> str:
    euros, rest = divmod(cents, 100)
    return f"{euros},{rest:02d}" if language == "de" else f"{euros}.{rest:02d}"


def receipt(language: str, rng: random.Random) -> Receipt:
    names = rng.sample(_ITEMS[language], rng.randint(6, 10))
    cents = [rng.randint(29, 1999) for _ in names]
    day, month = rng.randint(1, 28), rng.randint(1, 12)
    hour, minute = rng.randint(8, 19), rng.randint(0, 59)
    if language == "de":
        date = f"{day:02d}.{month:02d}.2025 {hour:02d}:{minute:02d}"
        total = ("SUMME EUR", price(sum(cents), language))
    else:
        date = f"{month:02d}/{day:02d}/2025 {hour:02d}:{minute:02d}"
        total = ("TOTAL GBP", price(sum(cents), language))
    items = tuple((n, price(c, language)) for n, c in zip(names, cents, strict=True))
    footer = _THANKS[language]
    return Receipt(language, (*_SHOPS[language], date), items, total, footer)
