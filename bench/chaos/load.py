"""The chaos run's load: closed-loop clients that send the planned requests back to back
for as long as the run lasts, check every answer and record it as an ``Answer``.

A 200 is checked by the caller's ``check`` (the model's own vectors); any other status
keeps the message its body gave. After a 429 or 503 a client pauses ``backoff_s``, not
the server's Retry-After: the run measures how soon the service answers again, not how
patient a client is."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from bench.chaos.accounting import OK, WRONG, Answer

Check = Callable[[int, bytes], bool]  # (request index, 200 body) -> the vectors are right
BACKOFF_S = 0.1


@dataclass(frozen=True, slots=True)
class Request:
    path: str
    body: bytes


def error_message(payload: bytes, headers: dict[str, str]) -> str:
    """What an error answer said: the message of either error shape (OpenAI's
    ``error.message``, TEI's ``error``), and its Retry-After if any."""
    try:
        error = json.loads(payload).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    text = str(message) if message else payload[:200].decode(errors="replace")
    retry = headers.get("Retry-After")
    return f"{text} (Retry-After: {retry})" if retry else text


class Load:
    """``clients`` closed-loop clients over ``requests`` (in turn, from a shared
    cursor) until ``stop()``; ``answers`` grows as they arrive, times from ``started``."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        requests: Sequence[Request],
        check: Check,
        *,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        self.session = session
        self.base_url = base_url
        self.requests = requests
        self.check = check
        self.backoff_s = backoff_s
        self.answers: list[Answer] = []
        self.started = time.monotonic()
        self._cursor = itertools.count()
        self._stopping = asyncio.Event()

    def now(self) -> float:
        return time.monotonic() - self.started

    def stop(self) -> None:
        self._stopping.set()

    async def run(self, clients: int) -> list[Answer]:
        """Until ``stop()``; the answers once the last client's request is in."""
        await asyncio.gather(*(self._client() for _ in range(clients)))
        return self.answers

    async def _client(self) -> None:
        while not self._stopping.is_set():
            i = next(self._cursor) % len(self.requests)
            answer = await self._one(i)
            self.answers.append(answer)
            if answer.outcome in ("429", "503"):
                await asyncio.sleep(self.backoff_s)

    async def _one(self, i: int) -> Answer:
        request = self.requests[i]
        sent = self.now()
        try:
            async with self.session.post(
                self.base_url + request.path,
                data=request.body,
                headers={"content-type": "application/json"},
            ) as response:
                payload = await response.read()
                status, headers = response.status, dict(response.headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return Answer(sent, self.now(), type(exc).__name__, str(exc)[:200])
        done = self.now()
        if status != 200:
            return Answer(sent, done, str(status), error_message(payload, headers))
        try:
            right = self.check(i, payload)
        except (ValueError, KeyError, TypeError) as exc:  # an unreadable 200 is a wrong one
            return Answer(sent, done, WRONG, f"unreadable: {exc!r}"[:200])
        return Answer(sent, done, OK) if right else Answer(sent, done, WRONG, "other vectors")
