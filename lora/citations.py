"""Sentences of German legal text, and the sections of the same law they cite.

A citation is a run of tokens that opens with ``§``, ``§§``, ``Art.`` or ``Artikel``
and goes on over numbers, sub-units (``Abs. 2``, ``Satz 1``, ``Nummer 8 Buchstabe b``)
and joiners (``,``, ``und``, ``bis``, ``sowie die §§``, ``in Verbindung mit §``)::

    §§ 4 bis 7 und des § 13 Abs. 1 Satz 1 und 2      -> § 4 to § 7, § 13
    § 843 Abs. 2 bis 4                               -> § 843 (2 to 4 are Absätze)

Numbers name sections until the first sub-unit; after it they are sub-units again
until the next ``§``. A run followed by a law's name or abbreviation ("des
Handelsgesetzbuchs", "der Verordnung (EU)", "des Zwölften Buches Sozialgesetzbuch",
"AGG") cites another law and resolves to nothing, as does a run that puts a ``§``
under an ``Artikel`` ("Artikel 247 § 6": the EGBGB's layout). When in doubt a
citation is dropped: a wrong pair teaches more harm than a missing one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass


def _vocabulary(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Abbreviations whose dot ends no sentence ("Abs.", "bzw.", "ABl."); any single
# letter with a dot ("z. B.", "i. V. m.", "S.") is one as well.
_ABBREVIATIONS = _vocabulary(
    "abs art nr nrn bzw vgl ggf gem insb sog usw etc ca buchst halbs alt var lit ziff anm "
    "bd dr abschn kap ff evtl einschl zzgl abzgl inkl mio mrd rn rdnr bzgl abl bgbl rgbl "
    "str st"
)
_MONTHS = _vocabulary(
    "januar februar märz april mai juni juli august september oktober november dezember"
)
# After these a number with a dot ("nach § 2.") ends a sentence; after any other word
# it is an ordinal ("des 18. Lebensjahres").
_CITING_WORDS = _vocabulary(
    "§ §§ abs. absatz absätze satz sätze nr. nummer nummern buchstabe art. artikel und oder bis ,"
)
_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[(„\"]?[A-ZÄÖÜ§])")
_LABEL = re.compile(r"^(?:\(\d+[a-z]?\)\s*)?(?:(?:\d+[a-z]?\.|[a-z]{1,2}\))\s+)?")
_TOKEN = re.compile(r"§§?|\d+[a-z]{0,2}(?!\w)|[^\W\d_]+\.?|\S")
_NUMBER = re.compile(r"\d+[a-z]{0,2}")
_LETTERS = re.compile(r"[^\W\d_]{2,}")

_SUB_UNITS = _vocabulary(
    "abs. absatz absatzes absätze absätzen satz satzes sätze sätzen s. nr. nummer nummern "
    "buchstabe buchstaben buchst. lit. halbsatz halbsatzes halbs. alternative alt. "
    "variante var. unterabsatz uabs."
)
_LETTER_UNITS = frozenset({"buchstabe", "buchstaben", "buchst.", "lit."})
_JOINERS = frozenset({",", "und", "oder", "bis", "sowie"})
# Words that may stand between two citations of one run ("und des §", "jeweils auch in
# Verbindung mit §"); anywhere else they end it.
_LINKS = _vocabulary("die der des den dem in verbindung mit i. v. m. jeweils auch")
_ARTICLES = frozenset({"des", "der", "desselben", "derselben"})
_LAW_NOUN = re.compile(
    r"gesetz|ordnung|buch|vertrag|richtlinie|übereinkommen|abkommen|statut|protokoll|"
    r"konvention|verfassung|rahmenbeschluss",
    re.IGNORECASE,
)
_ABBREVIATION = re.compile(r"[A-ZÄÖÜ]\w*[A-ZÄÖÜ]\w*")  # BGB, GmbHG, InsO, SGB
_AFTER = re.compile(r"\w[\w-]*\.?|\S")
_RANGE_LIMIT = 10  # a longer range ("§§ 1 bis 100 gelten") applies a block, cites none


def sentences(paragraph: str) -> list[str]:
    """One paragraph (a body line) in sentences, each without its leading "(1)" or
    "1." label."""
    out: list[str] = []
    start = 0
    for boundary in _BOUNDARY.finditer(paragraph):
        if _ends_sentence(paragraph[start : boundary.start()], paragraph[boundary.end() :]):
            out.append(paragraph[start : boundary.start()])
            start = boundary.end()
    out.append(paragraph[start:])
    return [text for s in out if (text := _LABEL.sub("", s.strip()))]


def _ends_sentence(before: str, after: str) -> bool:
    words = before.split()
    last = words[-1].strip('(„"').rstrip(".!?").lower() if words else ""
    if before.endswith("."):
        if (len(last) == 1 and last.isalpha()) or last in _ABBREVIATIONS:
            return False
        if _NUMBER.fullmatch(last):
            following = after.split(maxsplit=1)[0].lower() if after.split() else ""
            previous = words[-2].lower() if len(words) > 1 else ""
            return following not in _MONTHS and previous in _CITING_WORDS
    return True


@dataclass(frozen=True, slots=True)
class Citation:
    kind: str  # "§" or "Art", as in Section.number
    first: str  # "987"
    last: str  # "993" for a range, else first


@dataclass(frozen=True, slots=True)
class Run:
    """One citation run of a sentence: what it cites and where it stands."""

    citations: tuple[Citation, ...]
    start: int
    end: int
    external: bool  # a § under an Artikel: another law's layout, whatever follows


def runs(sentence: str) -> list[Run]:
    tokens = [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(sentence)]
    out: list[Run] = []
    i = 0
    while i < len(tokens):
        if _kind(tokens, i) is None:
            i += 1
            continue
        run, i = _run(tokens, i)
        out.append(run)
    return out


def citations(sentence: str, abbreviation: str = "") -> list[Citation]:
    """What a sentence cites within its own law (whose abbreviation, "BGB", counts as
    its own)."""
    return [
        c
        for r in runs(sentence)
        if not _names_a_law(sentence, r, abbreviation)
        for c in r.citations
    ]


def count_words(text: str) -> int:
    """Words of two letters or more (numbers and markers are not words)."""
    return len(_LETTERS.findall(text))


def words_outside_citations(sentence: str) -> int:
    """Words of two letters or more that are not part of a citation: "§ 5 gilt
    entsprechend." has two."""
    rest, cursor = [], 0
    for r in runs(sentence):
        rest.append(sentence[cursor : r.start])
        cursor = r.end
    rest.append(sentence[cursor:])
    return count_words(" ".join(rest))


Token = tuple[str, int, int]


def _kind(tokens: list[Token], i: int) -> str | None:
    """ "§" or "Art" if a citation opens at token ``i`` (a marker before a number)."""
    text = tokens[i][0]
    if i + 1 >= len(tokens) or not _NUMBER.fullmatch(tokens[i + 1][0]):
        return None
    if text in ("§", "§§"):
        return "§"
    if text in ("Art.", "Art", "Artikel"):
        return "Art"
    return None


def _run(tokens: list[Token], i: int) -> tuple[Run, int]:
    """The run that opens at token ``i``, and the index of the first token after it."""
    found: list[Citation] = []
    kinds: set[str] = set()
    start, end = tokens[i][1], i + 1  # end: one past the run's last number or sub-unit
    while True:
        kind = _kind(tokens, i)
        assert kind is not None
        kinds.add(kind)
        # "§§ 5, 6" and "Artikel 1 und 20" list sections; "§ 5, 6" is rare and ambiguous
        listing = tokens[i][0] != "§"
        found.append(Citation(kind, tokens[i + 1][0], tokens[i + 1][0]))
        sub_unit, lettered, joiner = False, False, ""  # lettered: after "Buchstabe"
        i = end = i + 2
        while i < len(tokens):
            text = tokens[i][0]
            low = text.lower()
            if _NUMBER.fullmatch(text):
                if sub_unit:
                    pass  # "Abs. 2 bis 4", "Nr. 3, 4"
                elif joiner == "bis":
                    found[-1] = Citation(kind, found[-1].first, text)
                elif listing and joiner:
                    found.append(Citation(kind, text, text))
                lettered, joiner = False, ""
            elif low in _SUB_UNITS:
                sub_unit, lettered, joiner = True, low in _LETTER_UNITS, ""
            elif low in _JOINERS:
                joiner = low
                i += 1
                continue
            elif not (lettered and len(text) == 1 and text.islower()):
                break  # anything but the letters of "Buchstaben b und c"
            else:
                joiner = ""
            i += 1
            end = i
        # a further citation of the same run: "und des § 13", "in Verbindung mit § 21"
        j = i
        while j < len(tokens) and tokens[j][0].lower() in _LINKS:
            j += 1
        if j < len(tokens) and _kind(tokens, j) is not None:
            i = j
            continue
        return Run(tuple(found), start, tokens[end - 1][2], external=len(kinds) > 1), i


def _names_a_law(sentence: str, run: Run, abbreviation: str) -> bool:
    if run.external:
        return True
    words = _words_after(sentence[run.end :])
    if not words:
        return False
    first = words[0]
    own = abbreviation.split()[0] if abbreviation.split() else ""
    if _ABBREVIATION.fullmatch(first):
        return first != own
    if first.lower() in _ARTICLES:
        # "der Verordnung", "des Gesetzes über", "des Zwölften Buches Sozialgesetzbuch"
        return any(_LAW_NOUN.search(w) or _ABBREVIATION.fullmatch(w) for w in words[1:4])
    return bool(_LAW_NOUN.search(first)) and first[0].isupper()


def _words_after(text: str) -> list[str]:
    """Up to four words right after a citation, up to the next punctuation; hyphenated
    names ("des Telekommunikation-Telemedien-Datenschutz-Gesetzes") are one word."""
    words: list[str] = []
    for token in _AFTER.finditer(text):
        word = token.group()
        if word in ("(", ")"):
            continue  # "der Verordnung (EU)"
        if not word[0].isalpha() or len(words) == 4:
            break
        words.append(word.rstrip("."))
    return words


def cited_ids(
    sentence: str, law: str, abbreviation: str, numbers: dict[str, list[str]]
) -> Iterator[str]:
    """Section ids of ``law`` that a sentence cites, in order; ``numbers`` maps a kind
    ("§", "Art") to the law's kept section numbers in document order ("823", "31a")."""
    for c in citations(sentence, abbreviation):
        kept = numbers.get(c.kind, [])
        if c.first == c.last:
            if c.first in kept:
                yield f"{law}/{c.kind}{c.first}"
            continue
        span = [n for n in kept if _key(c.first) <= _key(n) <= _key(c.last)]
        if len(span) <= _RANGE_LIMIT:
            yield from (f"{law}/{c.kind}{n}" for n in span)


def _key(number: str) -> tuple[int, str]:
    digits = re.match(r"\d+", number)
    assert digits is not None
    return int(digits.group()), number[digits.end() :]
