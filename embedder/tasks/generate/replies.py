"""The OpenAI generation bodies out: a whole completion, or server-sent event chunks.

A stream is ``data: {chunk}\\n\\n`` events: chat's first one carries the role, each
next one a text delta, the last one the finish reason; with
``stream_options.include_usage`` every chunk has ``usage: null`` and one more chunk,
with no choices, carries the counts; ``data: [DONE]`` ends it. Torch-free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson

from embedder.tasks.generate.requests import GenerateRequest

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class Reply:
    """What every chunk and the final body of one request share."""

    id: str
    model: str
    request: GenerateRequest
    created: int

    @classmethod
    def of(cls, job_id: str, model: str, request: GenerateRequest) -> Reply:
        prefix = "chatcmpl-" if request.kind == "chat" else "cmpl-"
        return cls(prefix + job_id, model, request, int(time.time()))

    @property
    def chat(self) -> bool:
        return self.request.kind == "chat"

    def _head(self, obj: str) -> dict[str, object]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(
        self,
        text: str,
        finish: str,
        prompt_tokens: int,
        completion_tokens: int,
        token_ids: list[int] | None = None,
    ) -> bytes:
        if self.chat:
            choice: dict[str, object] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            head = self._head("text_completion")
        if self.request.return_token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        usage = _usage(prompt_tokens, completion_tokens)
        return orjson.dumps({**head, "choices": [choice], "usage": usage})

    def _event(self, choices: list[dict[str, object]], usage: object = None) -> bytes:
        body = {**self._head("chat.completion.chunk" if self.chat else "text_completion")}
        body["choices"] = choices
        if self.request.include_usage:
            body["usage"] = usage
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def _choice(self, delta: dict[str, str], text: str, finish: str | None) -> dict[str, object]:
        if self.chat:
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

    def opening(self) -> bytes:
        """The first event, once the prompt is in: chat's role (completions: nothing)."""
        if not self.chat:
            return b""
        return self._event([self._choice({"role": "assistant", "content": ""}, "", None)])

    def delta(self, text: str) -> bytes:
        return self._event([self._choice({"content": text}, text, None)]) if text else b""

    def closing(self, text: str, finish: str, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The last events: the rest of the text with the finish reason, the usage chunk
        when asked for, then [DONE]."""
        last = self._event([self._choice({"content": text} if text else {}, text, finish)])
        if self.request.include_usage:
            last += self._event([], _usage(prompt_tokens, completion_tokens))
        return last + DONE


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
