"""Stop strings and the streamable part of the text: a delta never shows what a stop
string or an incomplete character may still change."""

from __future__ import annotations

from embedder.tasks.generate.text import TextSoFar

PIECES = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "\ufffd", 6: "é", 7: "END", 8: "!"}


def decode(ids: list[int]) -> str:
    text = "".join(PIECES[i] for i in ids)
    return text.replace("\ufffdé", "é")  # 5 then 6: one character in two tokens


def test_stop_string_cuts_and_stops() -> None:
    text = TextSoFar(decode, ["wor"])
    for token in (1, 2, 3):
        text.add(token)
    assert text.stopped and text.text == "Hello "


def test_delta_holds_back_a_possible_stop() -> None:
    text = TextSoFar(decode, ["lo w"])
    text.add(1)  # "Hel": the "l" may start "lo w"
    assert text.delta() == "He"
    text.add(2)  # "Hello": so may "lo"
    assert text.delta() == "l"
    text.add(4)  # "Hellold": it did not
    assert text.delta() == "lold"


def test_delta_holds_back_half_a_character() -> None:
    text = TextSoFar(decode, [])
    text.add(1)
    text.add(5)
    assert text.delta() == "Hel"
    text.add(6)
    assert text.delta() == "é"
    assert text.delta(final=True) == ""


def test_final_delta_flushes_the_rest() -> None:
    text = TextSoFar(decode, ["END!"])
    text.add(1)
    text.add(7)
    assert text.delta() == "Hel"
    assert text.delta(final=True) == "END"
    assert not text.stopped
