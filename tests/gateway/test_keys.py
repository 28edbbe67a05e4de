"""The API key check (gateway.keys): only a whole accepted key passes."""

from __future__ import annotations

import pytest

from gateway.keys import known_key

KEYS = ("key-one", "second-key")


@pytest.mark.parametrize("token", ["key-one", "second-key"])
def test_a_correct_key_passes(token: str) -> None:
    assert known_key(token, KEYS)


@pytest.mark.parametrize(
    "token",
    [
        "wrong",
        "",  # empty
        "key-",  # a prefix of a key
        "key-one-and-more",  # a key as its prefix
        "KEY-ONE",  # keys are case-sensitive
        "key-one ",  # nothing is stripped
        "key-onesecond-key",  # two keys run together
    ],
)
def test_anything_else_is_refused(token: str) -> None:
    assert not known_key(token, KEYS)


def test_no_key_is_known_when_none_are_accepted() -> None:
    assert not known_key("key-one", ())


def test_an_empty_token_never_passes_even_an_empty_key() -> None:
    assert not known_key("", ("",))


def test_non_ascii_keys_compare_as_their_bytes() -> None:
    assert known_key("schlüssel", ("schlüssel",))
    assert not known_key("schlussel", ("schlüssel",))
