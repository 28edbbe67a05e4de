"""Looking at raw JSON without parsing it: the depth of nesting (exact for valid JSON,
whatever the strings hold) and the token estimate with each text capped at the window;
and the worker's decoder classifying what is too deep, never crashing on it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedder.tasks.embed.codecs import RequestLimits, decode_embed, decode_rerank
from embedder.core.errors import InvalidRequest
from embedder.core.jobs import ApiShape
from embedder.core.rawjson import MAX_DEPTH, check_depth, depth, estimate_tokens


def true_depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((true_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((true_depth(v) for v in value.values()), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\, ab\n\u00e9'),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_depth_is_exact_for_any_json_value(value: object) -> None:
    for body in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
        assert depth(body.encode()) == true_depth(value)


def test_brackets_in_strings_never_count() -> None:
    body = json.dumps({"input": ["[" * 10_000, "{" * 10_000, '\\"[[[[', '"]]]]']}).encode()
    assert depth(body) == 2
    check_depth(body)  # no error


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 10_000, 1_000_000])
def test_check_depth_refuses_deeper_than_the_limit(levels: int) -> None:
    body = b'{"input": ' + b"[" * levels + b"]" * levels + b"}"
    with pytest.raises(InvalidRequest, match=f"nests {levels + 1} levels deep"):
        check_depth(body)


def test_check_depth_accepts_the_limit_itself() -> None:
    check_depth(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)


@pytest.mark.parametrize(
    ("shape", "decode"),
    [
        (ApiShape.OPENAI_EMBEDDINGS, decode_embed),
        (ApiShape.TEI_EMBED, decode_embed),
        (ApiShape.RAW_VECTORS, decode_embed),
        (ApiShape.TEI_RERANK, decode_rerank),
        (ApiShape.COHERE_RERANK, decode_rerank),
    ],
)
def test_the_worker_decoder_classifies_deep_bodies(
    shape: ApiShape, decode: Callable[[ApiShape, bytes, RequestLimits], object]
) -> None:
    # A job from any queue, not only from this gateway: a 422 for the job, never a crash.
    body = b'{"query": "q", "extra": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with pytest.raises(InvalidRequest, match="levels deep"):
        decode(shape, body, RequestLimits())


def test_estimate_caps_each_text_at_the_window() -> None:
    long = "x" * 1_000_000
    body = json.dumps({"inputs": [long, "short text", long], "truncate": True}).encode()
    whole = math.ceil(len(body) / 4)
    capped = estimate_tokens(body, 4.0, 256)
    assert capped < 2 * 256 + 50 < whole
    assert capped >= 2 * 256  # each long text still counts its full window


def test_estimate_of_a_small_body_is_its_size() -> None:
    body = json.dumps({"input": ["a b c", "d e f"]}).encode()
    assert estimate_tokens(body, 4.0, 256) == math.ceil(len(body) / 4)
    many = json.dumps({"input": ["a few words each"] * 500}).encode()
    assert estimate_tokens(many, 4.0, 8) == math.ceil(len(many) / 4)  # no text over 8


def test_past_the_depth_check_a_recursion_error_is_still_a_422(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import embedder.tasks.embed.codecs

    monkeypatch.setattr(embedder.tasks.embed.codecs, "check_depth", lambda body: None)
    # In a field the decoder skips (typed fields fail validation at their second level).
    body = b'{"inputs": "x", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(InvalidRequest, match="nests too deep to decode"):
        decode_embed(ApiShape.TEI_EMBED, body, RequestLimits())
