"""One streamed chat completion over server-sent events, timed.

The client is the same for every side, so the timings mean the same thing:
time to first token (TTFT) is from sending the request to the first chunk
that carries text (a chunk of only ``role`` or empty ``content`` is not a
token: OpenAI-style servers send one before any token); inter-token latency
(ITL) is the gap between consecutive text-carrying chunks. A chunk that
carries several tokens is one gap, which is what a user sees. Output tokens
come from the final ``usage`` chunk (``stream_options.include_usage``); a
server that sends none is counted by its text chunks and flagged.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp


class SseParser:
    """Bytes in, the ``data`` payload of each complete event out.

    Events end at a blank line; ``data:`` lines of one event join with a
    newline; comment lines (``:``) and other fields are ignored; ``\\r\\n``
    line ends are accepted. Bytes may arrive split anywhere.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        events: list[str] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return events
            line = self._buffer[:end].rstrip(b"\r").decode("utf-8")
            self._buffer = self._buffer[end + 1 :]
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)

    def close(self) -> list[str]:
        """The last event when the stream ended without its blank line."""
        events = self.feed(b"\n\n") if self._buffer or self._data else []
        return events


@dataclass(frozen=True)
class Stream:
    """What one streamed request saw, in ``time.perf_counter`` seconds."""

    sent_s: float
    ended_s: float
    status: int
    error: str | None  # None when the stream completed with [DONE]
    chunk_times_s: tuple[float, ...]  # arrival of each text-carrying chunk
    text: str
    completion_tokens: int | None  # from usage; None when the server sent none
    prompt_tokens: int | None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.chunk_times_s)

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] - self.sent_s if self.chunk_times_s else None

    @property
    def gaps_s(self) -> list[float]:
        times = self.chunk_times_s
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def time_per_output_token_s(self) -> float | None:
        """Decode time per token after the first: (last - first) / (tokens - 1)."""
        if len(self.chunk_times_s) < 2 or self.output_tokens < 2:
            return None
        return (self.chunk_times_s[-1] - self.chunk_times_s[0]) / (self.output_tokens - 1)


def _delta_text(choice: dict[str, Any]) -> str:
    """Text of a chat chunk (``delta.content``) or a completions chunk (``text``)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        return content if isinstance(content, str) else ""
    text = choice.get("text")
    return text if isinstance(text, str) else ""


async def stream_once(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float
) -> Stream:
    """POST ``body`` to ``url`` and read its event stream to ``[DONE]``; never raises
    for what the server or the connection did (that is in ``error``)."""
    sent = time.perf_counter()
    times: list[float] = []
    parts: list[str] = []
    usage: dict[str, Any] = {}
    status = 0
    error: str | None = "the stream ended before data: [DONE]"
    parser = SseParser()
    try:
        async with session.post(
            url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            status = response.status
            if status != 200:
                detail = (await response.text())[:300]
                failed = f"HTTP {status}: {detail}"
                return Stream(sent, time.perf_counter(), status, failed, (), "", None, None)
            done = False
            async for raw in response.content.iter_any():
                now = time.perf_counter()
                for data in parser.feed(raw):
                    done = done or _take(data, now, times, parts, usage)
                if done:
                    break
            if not done:
                for data in parser.close():
                    done = done or _take(data, time.perf_counter(), times, parts, usage)
            if done:
                error = None
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return Stream(
        sent_s=sent,
        ended_s=time.perf_counter(),
        status=status,
        error=error,
        chunk_times_s=tuple(times),
        text="".join(parts),
        completion_tokens=_int(usage.get("completion_tokens")),
        prompt_tokens=_int(usage.get("prompt_tokens")),
    )


def _take(
    data: str, now: float, times: list[float], parts: list[str], usage: dict[str, Any]
) -> bool:
    """Account one event; True at ``[DONE]``. Malformed JSON raises ValueError."""
    if data.strip() == "[DONE]":
        return True
    event = json.loads(data)
    if not isinstance(event, dict):
        raise ValueError(f"an event that is not a JSON object: {data[:100]!r}")
    if "error" in event:
        raise ValueError(f"the server streamed an error: {json.dumps(event['error'])[:200]}")
    text = "".join(_delta_text(c) for c in event.get("choices") or [] if isinstance(c, dict))
    if text:
        times.append(now)
        parts.append(text)
    if isinstance(event.get("usage"), dict):
        usage.update(event["usage"])
    return False


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
