"""Calibration text: real prose cut to a mix of lengths, deterministically.

English comes from the Python interpreter itself, ``pydoc_data.topics`` (the language
reference topics ``help()`` shows), so every machine with the same Python tunes on the
same texts and nothing is downloaded. Topics are split at their underlined headings
into (heading, body) sections; code blocks and grammar rules are dropped. German
prose (laws) is read above this package and passed in as paragraphs.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

SEED = 20261201
# (share, fewest words, most words): queries, paragraphs, long paragraphs, documents past
# a 256-token window (so truncation is part of what is timed).
LENGTH_MIX: tuple[tuple[float, int, int], ...] = (
    (0.40, 4, 20),
    (0.30, 20, 80),
    (0.20, 80, 170),
    (0.10, 170, 380),
)
_UNDERLINE = re.compile(r"^([*=\-^~])\1{2,}\s*$")


@dataclass(frozen=True, slots=True)
class TextSection:
    title: str
    body: str  # prose paragraphs, separated by newlines


def _is_prose(paragraph: str) -> bool:
    lines = paragraph.splitlines()
    if any(line.startswith((" ", "\t", ">>>")) for line in lines):
        return False  # code, grammar rules and indented examples
    text = " ".join(lines)
    letters = sum(c.isalpha() or c.isspace() for c in text)
    return len(text.split()) >= 4 and letters >= 0.85 * len(text)


def _section(title: str | None, body: list[str]) -> TextSection | None:
    prose = [" ".join(p.split()) for p in "\n".join(body).split("\n\n") if _is_prose(p)]
    return TextSection(title, "\n".join(prose)) if title and prose else None


def english_sections() -> list[TextSection]:
    """Every titled section of the Python language reference topics, with prose."""
    from pydoc_data.topics import topics

    found: list[TextSection | None] = []
    for key in sorted(topics):
        lines = topics[key].splitlines()
        title: str | None = None
        body: list[str] = []
        for i, line in enumerate(lines):
            if i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1]) and line.strip():
                found.append(_section(title, body))
                title, body = line.strip(), []
            elif not _UNDERLINE.match(line):
                body.append(line)
        found.append(_section(title, body))
    return [s for s in found if s is not None]


def paragraphs_of(sections: Sequence[TextSection]) -> list[str]:
    return [p for s in sections for p in s.body.split("\n") if p.strip()]


def mixed_lengths(paragraphs: Sequence[str], n: int, seed: int = SEED) -> list[str]:
    """``n`` texts whose word counts follow LENGTH_MIX, each cut from the stream of
    paragraphs (shuffled with ``seed``) at word boundaries: the same texts every time."""
    words = [w for p in paragraphs for w in p.split()]
    if not words:
        raise ValueError("no calibration text: the source has no prose")
    rng = random.Random(seed)
    texts: list[str] = []
    at = rng.randrange(len(words))
    for share, low, high in LENGTH_MIX:
        for _ in range(max(1, round(share * n))):
            size = rng.randint(low, high)
            piece = [words[(at + j) % len(words)] for j in range(size)]
            at = (at + size + rng.randrange(50)) % len(words)
            texts.append(" ".join(piece))
    rng.shuffle(texts)  # arrival order mixes lengths, as traffic does
    return texts[:n]
