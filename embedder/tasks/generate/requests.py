"""The OpenAI generation bodies in: ``/v1/chat/completions`` and ``/v1/completions``.

Decoded with msgspec, unknown fields ignored as OpenAI does. Torch-free: the gateway
reads the same routing fields (``Routing``) to annotate a job, the worker decodes the
whole body (``decode``). A field out of range is an InvalidRequest (422) naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from embedder.core.errors import InvalidRequest
from embedder.core.jobs import ApiShape
from embedder.core.rawjson import decode_struct

MAX_STOPS = 4  # as OpenAI


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class Routing(msgspec.Struct):
    """What the gateway reads of a generation body: enough to size and route the job."""

    model: str | None = None
    adapter: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = None
    stream: bool | None = None


class _Part(msgspec.Struct):
    type: str
    text: str | None = None


class _Message(msgspec.Struct):
    role: str
    content: str | list[_Part] | None = None


class _Common(msgspec.Struct):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # vLLM's extension: the generated ids in each choice


class ChatBody(_Common):
    messages: list[_Message] = []
    max_completion_tokens: int | None = None


class CompletionBody(_Common):
    prompt: str | list[str | int] | None = None


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    kind: Literal["chat", "completion"]
    messages: tuple[dict[str, str], ...]  # chat
    prompt: str | tuple[int, ...]  # completion: text, or token ids
    max_new_tokens: int | None  # None: the model's default
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool
    return_token_ids: bool = False


def max_new_tokens(routing: Routing) -> int | None:
    """The tokens a request asks for (``max_completion_tokens`` wins, as OpenAI's newer
    name), checked positive."""
    asked = routing.max_completion_tokens or routing.max_tokens
    if asked is not None and asked <= 0:
        raise InvalidRequest(f"max_tokens must be at least 1, got {asked}")
    return asked


def check_n(n: int | None) -> None:
    if n is not None and n != 1:
        raise InvalidRequest(
            f"n={n} is not supported: this server generates one choice per request; send "
            "n=1 (or leave it out) and send parallel requests for more choices"
        )


def _content(message: _Message, i: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise InvalidRequest(
                f"messages[{i}] has a {part.type!r} part: only text parts are supported"
            )
        texts.append(part.text)
    return "".join(texts)


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOPS:
        raise InvalidRequest(f"stop takes at most {MAX_STOPS} strings, got {len(stops)}")
    return stops


def decode(shape: ApiShape, body: bytes) -> GenerateRequest:
    kind: type[ChatBody] | type[CompletionBody] = (
        ChatBody if shape is ApiShape.OPENAI_CHAT else CompletionBody
    )
    req = decode_struct(body, kind)
    check_n(req.n)
    temperature = 1.0 if req.temperature is None else req.temperature
    if not 0.0 <= temperature <= 2.0:
        raise InvalidRequest(f"temperature must be between 0 and 2, got {temperature}")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0.0 < top_p <= 1.0:
        raise InvalidRequest(f"top_p must be above 0 and at most 1, got {top_p}")
    routing = Routing(max_tokens=req.max_tokens, n=req.n)
    messages: tuple[dict[str, str], ...] = ()
    prompt: str | tuple[int, ...] = ""
    if isinstance(req, ChatBody):
        routing.max_completion_tokens = req.max_completion_tokens
        if not req.messages:
            raise InvalidRequest("messages is empty: send at least one message")
        messages = tuple(
            {"role": m.role, "content": _content(m, i)} for i, m in enumerate(req.messages)
        )
    else:
        if req.prompt is None or req.prompt == "" or req.prompt == []:
            raise InvalidRequest("prompt is missing or empty: send a string")
        if isinstance(req.prompt, str):
            prompt = req.prompt
        elif all(isinstance(p, int) for p in req.prompt):
            prompt = tuple(int(p) for p in req.prompt)
        elif len(req.prompt) == 1 and isinstance(req.prompt[0], str):
            prompt = req.prompt[0]
        else:
            raise InvalidRequest(
                f"prompt has {len(req.prompt)} strings: send one prompt per request"
            )
    stream = bool(req.stream)
    usage = stream and req.stream_options is not None and req.stream_options.include_usage
    return GenerateRequest(
        kind="chat" if isinstance(req, ChatBody) else "completion",
        messages=messages,
        prompt=prompt,
        max_new_tokens=max_new_tokens(routing),
        temperature=temperature,
        top_p=top_p,
        stop=_stops(req.stop),
        seed=req.seed,
        stream=stream,
        include_usage=usage,
        return_token_ids=req.return_token_ids,
    )
