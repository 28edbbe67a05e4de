"""Parsing laws: which headings open sections, what is dropped, how bodies are cleaned."""

from __future__ import annotations

from pathlib import Path

import pytest

from lora.gesetze import parse_law, read_law, read_laws
from tests.lora.laws import URLAUB, VERFASSUNG, write_laws

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "gesetze"


def test_sections_are_headings_with_their_bodies() -> None:
    law = parse_law(URLAUB, "turlg")
    assert (law.slug, law.abbreviation, law.title) == ("turlg", "TUrlG", "Testurlaubsgesetz")
    assert [(s.number, s.title) for s in law.sections] == [
        ("§ 1", "Urlaubsanspruch"),
        ("§ 2", "Dauer des Urlaubs"),
        ("§ 8", "Staffel"),
        ("§ 10a", "Zeitpunkt, Übertragbarkeit und Abgeltung"),
    ]
    assert law.sections[0].body == (
        "Jeder Arbeitnehmer hat in jedem Kalenderjahr Anspruch auf bezahlten Erholungsurlaub."
    )
    assert [s.id for s in law.sections] == ["turlg/§1", "turlg/§2", "turlg/§8", "turlg/§10a"]


def test_repealed_untitled_and_empty_sections_are_dropped() -> None:
    law = parse_law(URLAUB, "turlg")
    numbers = {s.number for s in law.sections}
    assert not numbers & {"§§ 3 bis 6", "§ 7", "§ 9"}
    assert law.dropped == 3


def test_bodies_lose_footnotes_notes_bullets_and_escapes() -> None:
    by_number = {s.number: s for s in parse_law(URLAUB, "turlg").sections}
    assert by_number["§ 2"].body == (
        "(1) Der Urlaub beträgt jährlich mindestens 24 Werktage.\n"
        "(2) Als Werktage gelten alle Kalendertage, die nicht Sonn- oder gesetzliche "
        "Feiertage sind."
    )
    assert by_number["§ 8"].body == (
        "Der Urlaub beträgt\n5 bis 20 Jahre\n24 Tage,\nmehr als 20 Jahre 30 Tage."
    )
    assert by_number["§ 10a"].body == "Der Urlaub ist zu gewähren. Siehe die Richtlinie 22. Mai."


def test_a_structure_heading_ends_a_section() -> None:
    last = parse_law(URLAUB, "turlg").sections[-1]
    assert "Tabelle" not in last.body


def test_articles_count_when_they_have_a_title() -> None:
    law = parse_law(VERFASSUNG, "tverf")
    assert [(s.number, s.title) for s in law.sections] == [("Art 2", "Persönliche Freiheitsrechte")]
    assert law.abbreviation == "TVERF"  # no jurabk: the slug


def test_read_laws_reads_a_folder_sorted(tmp_path: Path) -> None:
    laws = read_laws(write_laws(tmp_path))
    assert [law.slug for law in laws] == ["tkschg", "turlg", "tverf"]


@pytest.mark.skipif(not (SHARED / "burlg.md").is_file(), reason="shared law data not present")
def test_a_real_law() -> None:
    law = read_law(SHARED / "burlg.md")
    assert law.abbreviation == "BUrlG"
    first = law.sections[0]
    assert (first.number, first.title) == ("§ 1", "Urlaubsanspruch")
    assert first.body.startswith("Jeder Arbeitnehmer hat in jedem Kalenderjahr Anspruch")
    assert all(s.title and s.body and "weggefallen" not in s.title for s in law.sections)
    assert all(not set(s.body) & set("#[]\\") for s in law.sections)
    assert len({s.id for s in law.sections}) == len(law.sections)
