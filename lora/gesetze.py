"""German federal laws in Markdown, parsed into their ``§`` (or ``Art``) sections.

The format (one law per file, as in ``gesetze/*.md``)::

    ---
    Title: Mindesturlaubsgesetz für Arbeitnehmer
    jurabk: BUrlG
    ---

    # Mindesturlaubsgesetz für Arbeitnehmer (BUrlG)
    ## Erster Abschnitt - Allgemeine Vorschriften      <- structure: not a section
    ##### § 1 Urlaubsanspruch                           <- a section: number, then title
    Jeder Arbeitnehmer hat ...                          <- its body, up to the next heading

Headings of any level that start with ``§``, ``§§`` or ``Art`` (optionally after the
``(XXXX)`` marker of a range) open a section; any other heading closes it. A section
is kept only if it has a title, is not repealed ("weggefallen") and has a body with
words in it: the GG's untitled articles and repealed ranges yield nothing.

Bodies are cleaned of markup: footnote references and definitions, editorial notes
after a ``-----`` rule, list bullets, emphasis, backslash escapes and hard line wraps
(paragraphs stay on their own lines).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
_SECTION = re.compile(
    r"^(?:\(X+\)\s*)?(?P<kind>§§?|Art\.?|Artikel)\s*"
    r"(?P<number>\d+[a-z]{0,3}(?:\s+(?:bis|und)\s+\d+[a-z]{0,3})?)(?!\w)\s*(?P<title>.*)$"
)
_REPEALED = re.compile(r"\(?\s*weggefallen\s*\)?", re.IGNORECASE)
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.DOTALL)
_FOOTNOTE_REF = re.compile(r"\[\^[^\]]*\]")
_FOOTNOTE_DEF = re.compile(r"^\[\^[^\]]*\]:")
_NOTES_RULE = re.compile(r"^-{5,}\s*$")
_MARKER = re.compile(r"^(?:[*+:-](?:\s+|$))+")  # bullets, nested ("*    *   bis zu"), definitions
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|<>])")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_EMPHASIS = re.compile(r"(\*\*|__)")
_TAG = re.compile(r"</?[A-Za-z][^>]*>")
_TITLE_MARK = re.compile(r"\s*(?:\*+\)?|\+\))\.?\s*$")  # "Übergangsmandat *)" and friends
_NOTE_MARK = re.compile(r"\s?(?<!\()[*+]\)")  # "im Internet *);" points to a dropped note
_SPACES = re.compile(r"[ \t\u00a0]+")
_WORD = re.compile(r"\w{2,}")


@dataclass(frozen=True, slots=True)
class Section:
    law: str  # the law's slug (file stem), e.g. "bgb"
    number: str  # as written: "§ 31a", "Art 12a"
    title: str  # the heading without its number: the query
    body: str  # cleaned text, paragraphs separated by newlines: the passage

    @property
    def id(self) -> str:
        """Unique within a set of laws: ``bgb/§31a``."""
        return f"{self.law}/{self.number.replace(' ', '')}"


@dataclass(frozen=True, slots=True)
class Law:
    slug: str
    abbreviation: str  # "BGB", from the front matter's jurabk (the slug upper-cased if absent)
    title: str
    sections: tuple[Section, ...]
    dropped: int = 0  # section headings without a title, repealed or with an empty body


def _front_matter(text: str) -> tuple[dict[str, str], str]:
    match = _FRONT_MATTER.match(text)
    if match is None:
        return {}, text
    fields: dict[str, str] = {}
    for line in match.group(1).splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields, text[match.end() :]


def _inline(text: str) -> str:
    text = _FOOTNOTE_REF.sub("", text)
    text = _LINK.sub(r"\1", text)
    text = _TAG.sub("", text)
    text = _EMPHASIS.sub("", text)
    return _NOTE_MARK.sub("", _ESCAPE.sub(r"\1", text))


def clean_title(raw: str) -> str:
    title = _inline(raw)
    title = _TITLE_MARK.sub("", title)
    return _SPACES.sub(" ", title).strip(" -–")


def clean_body(lines: Iterable[str]) -> str:
    """Plain text of a section body: one line per paragraph, markup removed."""
    paragraphs: list[list[str]] = [[]]
    in_footnote = False
    for raw in lines:
        if _NOTES_RULE.match(raw):
            break  # editorial notes ("*) Gemäß Artikel 14 ...") follow the rule
        if _FOOTNOTE_DEF.match(raw):
            in_footnote = True  # "[^id]: **Amtlicher Hinweis:** ...", indented continuation
            continue
        if in_footnote:
            if not raw.strip() or raw.startswith((" ", "\t")):
                continue
            in_footnote = False
        line = raw.strip()
        if not line:
            if paragraphs[-1]:
                paragraphs.append([])
            continue
        line = _MARKER.sub("", line)
        line = _SPACES.sub(" ", _inline(line)).strip()
        if line:
            paragraphs[-1].append(line)
    text = "\n".join(" ".join(p) for p in paragraphs if p)
    return text if _WORD.search(text) else ""


def _keep(title: str, body: str) -> bool:
    if not title or _REPEALED.fullmatch(title) or _REPEALED.search(title):
        return False
    return bool(body) and not _REPEALED.fullmatch(body.strip())


def parse_law(text: str, slug: str) -> Law:
    """The kept sections of one law file, in document order."""
    meta, text = _front_matter(text)
    sections: list[Section] = []
    law_title = meta.get("Title", "")
    current: tuple[str, str] | None = None  # (number, title) of the open section
    body: list[str] = []
    dropped = 0

    def close() -> None:
        nonlocal dropped
        if current is not None:
            number, title = current
            cleaned = clean_body(body)
            if _keep(title, cleaned):
                sections.append(Section(slug, number, title, cleaned))
            else:
                dropped += 1

    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading is None:
            body.append(line)
            continue
        close()
        current, body = None, []
        text_of_heading = heading.group(2)
        if len(heading.group(1)) == 1 and not law_title:
            law_title = clean_title(text_of_heading)
        section = _SECTION.match(_ESCAPE.sub(r"\1", text_of_heading))
        if section is not None:
            kind = section.group("kind").rstrip(".")
            kind = "Art" if kind == "Artikel" else kind
            number = f"{kind} {_SPACES.sub(' ', section.group('number'))}"
            current = (number, clean_title(section.group("title")))
    close()
    abbreviation = meta.get("jurabk") or slug.upper()
    return Law(slug, abbreviation, law_title or abbreviation, tuple(_unique(sections)), dropped)


def _unique(sections: list[Section]) -> list[Section]:
    """A number appears once per law; a repeat (an annex restating a section) gets a
    suffix so that ids stay unique."""
    seen: dict[str, int] = {}
    out: list[Section] = []
    for s in sections:
        n = seen.get(s.id, 0)
        seen[s.id] = n + 1
        out.append(s if n == 0 else Section(s.law, f"{s.number} ({n + 1})", s.title, s.body))
    return out


def read_law(path: Path) -> Law:
    return parse_law(path.read_text(encoding="utf-8"), path.stem.lower())


def read_laws(folder: Path) -> list[Law]:
    """Every ``*.md`` law in a folder, sorted by slug."""
    paths = sorted(folder.glob("*.md"), key=lambda p: p.stem.lower())
    return [read_law(p) for p in paths]
