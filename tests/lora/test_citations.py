"""Sentence splitting and citations, on sentences as the real laws write them."""

from __future__ import annotations

import pytest

from lora.citations import Citation, citations, cited_ids, sentences, words_outside_citations


def cites(sentence: str, abbreviation: str = "BGB") -> list[tuple[str, str, str]]:
    return [(c.kind, c.first, c.last) for c in citations(sentence, abbreviation)]


@pytest.mark.parametrize(
    ("sentence", "expected"),
    [
        # BGB § 840
        ("Ist neben demjenigen, der nach den §§ 831, 832 zum Ersatz verpflichtet ist, ein "
         "anderer verantwortlich, so ist der andere allein verpflichtet.",
         [("§", "831", "831"), ("§", "832", "832")]),
        # sub-units are no sections: "2 bis 4" are Absätze of § 843
        ("Die Vorschriften des § 843 Abs. 2 bis 4 finden entsprechende Anwendung.",
         [("§", "843", "843")]),
        ("Wer nach § 823 Abs. 1 zum Ersatz verpflichtet ist, haftet.", [("§", "823", "823")]),
        ("Die Vorschriften der §§ 987 bis 993 finden Anwendung.", [("§", "987", "993")]),
        # KSchG § 23
        ("Die Vorschriften des Ersten Abschnitts gelten mit Ausnahme der §§ 4 bis 7 und des "
         "§ 13 Abs. 1 Satz 1 und 2 nicht für Betriebe und Verwaltungen.",
         [("§", "4", "7"), ("§", "13", "13")]),
        # BGB § 475
        ("Die §§ 475b bis 475e und die §§ 476 und 477 über die Rechte gelten.",
         [("§", "475b", "475e"), ("§", "476", "476"), ("§", "477", "477")]),
        # TzBfG § 21
        ("Wird ein Arbeitsvertrag unter einer Bedingung geschlossen, gelten § 4 Abs. 2, § 5, "
         "§ 14 Abs. 1 und 4, § 15 Abs. 2, 3 und 5 sowie die §§ 16 bis 20 entsprechend.",
         [("§", "4", "4"), ("§", "5", "5"), ("§", "14", "14"), ("§", "15", "15"),
          ("§", "16", "20")]),
        # AktG § 96: "dieses Gesetzes" is the law itself
        ("Der Aufsichtsrat hat das Mindestanteilsgebot nach § 96 Absatz 2 Satz 1 dieses "
         "Gesetzes zu erfüllen.", [("§", "96", "96")]),
        ("Die in Artikel 1 und 20 niedergelegten Grundsätze werden berührt.",
         [("Art", "1", "1"), ("Art", "20", "20")]),
        ("Die Freiheit nach Art. 12 Abs. 1 wird gewährleistet.", [("Art", "12", "12")]),
        # the law's own abbreviation names the law itself
        ("Eine Verjährung nach § 195 BGB tritt ein.", [("§", "195", "195")]),
    ],
)  # fmt: skip
def test_citations_of_the_same_law(sentence: str, expected: list[tuple[str, str, str]]) -> None:
    assert cites(sentence) == expected


@pytest.mark.parametrize(
    "sentence",
    [
        # InsO § 36
        "Tiere nach § 811 Absatz 1 Nummer 8 Buchstabe b der Zivilprozessordnung sind frei.",
        "Die Sachen nach § 811 Absatz 1 Nummer 1 Buchstabe b und c der Zivilprozessordnung.",
        # HGB § 30
        "Eine Geldbuße nach § 30 des Gesetzes über Ordnungswidrigkeiten wird verhängt.",
        "Ein Anspruch nach § 15 AGG bleibt unberührt.",
        "Die Frist nach § 3 BGB beginnt mit dem Tag.",  # in another law than the BGB
        # StPO § 100a: the law named at the end covers the whole run
        "Sätze, bei denen entsprechend § 176e Absatz 5 oder § 184b Absatz 6 des "
        "Strafgesetzbuches Handlungen vorgenommen werden.",
        "wegen Mordes (§ 211 des Strafgesetzbuches) angeklagt",
        # BGB § 312d: a § under an Artikel is the EGBGB's
        "Die Angaben nach Artikel 247 §§ 6 bis 13 des Einführungsgesetzes zum Bürgerlichen "
        "Gesetzbuche werden Inhalt des Vertrags.",
        "Die Beiträge nach § 28a des Vierten Buches Sozialgesetzbuch werden gemeldet.",
        "Die Verarbeitung nach Artikel 6 Absatz 1 Buchstabe e der Verordnung (EU) 2016/679 ist "
        "zulässig.",
        "Dienste im Sinne des § 2 des Telekommunikation-Telemedien-Datenschutz-Gesetzes.",
        "Hausgewerbetreibende (§ 1 Abs. 1 Buchstabe b des Heimarbeitsgesetzes) erhalten Urlaub.",
    ],
)
def test_citations_of_other_laws_resolve_to_nothing(sentence: str) -> None:
    assert cites(sentence, "AGG" if "BGB" in sentence else "BGB") == []


def test_sentences_keep_abbreviations_dates_and_ordinals_whole() -> None:
    paragraph = (
        "(1) Der Urlaub beträgt z. B. 24 Tage i. V. m. § 3 Abs. 2. Die Frist endet am 1. "
        "Januar. Sie gilt bis zur Vollendung des 18. Lebensjahres. Ferner gilt § 5 Nr. 3. "
        "Das steht im Amtsblatt (ABl. L 119 vom 4.5.2016, S. 1). Ende."
    )
    assert sentences(paragraph) == [
        "Der Urlaub beträgt z. B. 24 Tage i. V. m. § 3 Abs. 2.",
        "Die Frist endet am 1. Januar.",
        "Sie gilt bis zur Vollendung des 18. Lebensjahres.",
        "Ferner gilt § 5 Nr. 3.",
        "Das steht im Amtsblatt (ABl. L 119 vom 4.5.2016, S. 1).",
        "Ende.",
    ]
    assert sentences("2. wer nach § 5 handelt,") == ["wer nach § 5 handelt,"]


def test_words_outside_citations() -> None:
    assert words_outside_citations("§ 5 Abs. 1 gilt entsprechend.") == 2
    assert words_outside_citations("§ 281 Absatz 2 und § 440 sind nicht anzuwenden.") == 3


def test_cited_ids_expand_short_ranges_of_kept_sections() -> None:
    numbers = {"§": ["1", "2", "2a", "3", "5"] + [str(n) for n in range(10, 22)]}
    assert list(cited_ids("nach den §§ 2 bis 4 und § 9", "x", "X", numbers)) == [
        "x/§2",
        "x/§2a",
        "x/§3",
    ]
    assert list(cited_ids("die §§ 10 bis 21 gelten", "x", "X", numbers)) == []  # a block
    assert citations("§§ 10 bis 21") == [Citation("§", "10", "21")]
