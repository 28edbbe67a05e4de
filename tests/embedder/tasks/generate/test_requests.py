"""The OpenAI generation bodies as the worker decodes them: fields, defaults, and a 422
naming the field for each value out of range."""

from __future__ import annotations

import json

import pytest

from embedder.core.errors import InvalidRequest
from embedder.tasks.generate.requests import decode
from embedder.core.jobs import ApiShape

CHAT, COMPLETION = ApiShape.OPENAI_CHAT, ApiShape.OPENAI_COMPLETIONS


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_chat_fields_and_defaults() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    req = decode(CHAT, body(messages=[{"role": "user", "content": parts}], unknown={"x": 1}))
    assert req.kind == "chat" and req.messages == ({"role": "user", "content": "ab"},)
    assert (req.temperature, req.top_p, req.max_new_tokens, req.stop) == (1.0, 1.0, None, ())
    assert not req.stream and not req.include_usage


def test_max_completion_tokens_wins_and_usage_only_when_streaming() -> None:
    msgs = [{"role": "user", "content": "x"}]
    req = decode(CHAT, body(messages=msgs, max_tokens=5, max_completion_tokens=9,
                            stream=True, stream_options={"include_usage": True}))  # fmt: skip
    assert req.max_new_tokens == 9 and req.stream and req.include_usage
    plain = decode(CHAT, body(messages=msgs, stream_options={"include_usage": True}))
    assert not plain.include_usage


def test_completion_prompts() -> None:
    assert decode(COMPLETION, body(prompt="hi", stop="\n")).prompt == "hi"
    assert decode(COMPLETION, body(prompt=["hi"])).prompt == "hi"
    assert decode(COMPLETION, body(prompt=[1, 2, 3])).prompt == (1, 2, 3)
    assert decode(COMPLETION, body(prompt="x", stop="\n")).stop == ("\n",)


@pytest.mark.parametrize(
    ("shape", "fields", "message"),
    [
        (CHAT, {"messages": []}, "messages is empty"),
        (CHAT, {"messages": [{"role": "user", "content": "x"}], "n": 3}, "n=3 is not supported"),
        (COMPLETION, {"prompt": "x", "temperature": 3}, "temperature must be between 0 and 2"),
        (COMPLETION, {"prompt": "x", "top_p": 0}, "top_p must be above 0"),
        (COMPLETION, {"prompt": "x", "max_tokens": 0}, "max_tokens must be at least 1"),
        (COMPLETION, {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
        (COMPLETION, {"prompt": ["a", "b"]}, "send one prompt per request"),
        (COMPLETION, {"prompt": ""}, "prompt is missing or empty"),
        (COMPLETION, {"prompt": 5}, "invalid request body"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "only text parts"),
    ],
)  # fmt: skip
def test_bad_values_are_422s(shape: ApiShape, fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        decode(shape, body(**fields))


def test_not_json_is_a_422() -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        decode(CHAT, b"{nope")
