"""Small laws in the real format (front matter, structure headings, § sections with
footnotes, bullets, editorial notes, repealed and untitled sections), for tests."""

from __future__ import annotations

from pathlib import Path

URLAUB = """\
---
Title: Testurlaubsgesetz
jurabk: TUrlG
layout: default
slug: turlg

---

# Testurlaubsgesetz (TUrlG)

Ausfertigungsdatum
:   1963-01-08

## Eingangsformel

Der Bundestag hat das folgende Gesetz beschlossen:

## Erster Abschnitt - Allgemeine Vorschriften

### § 1 Urlaubsanspruch

Jeder Arbeitnehmer hat in jedem Kalenderjahr Anspruch auf bezahlten
Erholungsurlaub.

### § 2 Dauer des Urlaubs \\*)

[^BJNR1]

(1) Der Urlaub beträgt jährlich mindestens 24 Werktage.

(2) Als Werktage gelten alle Kalendertage, die nicht Sonn- oder
gesetzliche Feiertage sind \\*).

[^BJNR1]:     **Amtlicher Hinweis:**              Diese Vorschrift dient der
    Umsetzung einer Richtlinie.

-----

\\*) Gemäß Artikel 14 gilt dies erst ab 2002.

##### (XXXX) §§ 3 bis 6 (weggefallen)



### § 7 (weggefallen)

### § 8 Staffel

Der Urlaub beträgt

*    *   5 bis 20 Jahre

*    *
    *   24 Tage,

-   mehr als 20 Jahre 30 Tage.

### § 9

-

### § 10a Zeitpunkt, Übertragbarkeit und Abgeltung

Der Urlaub ist zu gewähren. Siehe [die Richtlinie](https://example.org) 22\\. Mai.

## Anlage (zu § 2)

Eine Tabelle, die zu keinem Paragraphen gehört.
"""

KUENDIGUNG = """\
---
Title: Testkündigungsgesetz
jurabk: TKSchG
---

# Testkündigungsgesetz (TKSchG)

## § 1 Sozial ungerechtfertigte Kündigungen

Die Kündigung ist rechtsunwirksam, wenn sie sozial ungerechtfertigt ist.

## § 2 Änderungskündigung

Kündigt der Arbeitgeber und bietet er eine Fortsetzung zu geänderten Bedingungen an, so
kann der Arbeitnehmer das Angebot unter Vorbehalt annehmen.

## § 3 Dauer des Urlaubs

Ein zweiter Abschnitt mit einer bekannten Überschrift.
"""

VERFASSUNG = """\
---
Title: Testverfassung
---

# Testverfassung

### Art 1

(1) Die Würde ist unantastbar.

### Art 2 Persönliche Freiheitsrechte

Jeder hat das Recht auf die freie Entfaltung seiner Persönlichkeit.
"""


def write_laws(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("turlg", URLAUB), ("tkschg", KUENDIGUNG), ("tverf", VERFASSUNG)):
        (folder / f"{name}.md").write_text(text, encoding="utf-8")
    return folder
