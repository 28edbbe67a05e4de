"""The open-loop sender: each planned request goes out at its time (``traffic.plan``)
whether or not earlier ones have been answered, and every answer is checked and kept
as an ``Answer``. A request carries ``x-request-timeout-ms``: the deadline within which
its model must be loaded and its vectors computed. No request is retried: a refusal is
an answer to count, not something to hide behind a client's patience."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence

import aiohttp

from bench.chaos.load import error_message
from bench.fleet.accounting import OK, WRONG, Answer
from bench.fleet.traffic import Planned

# (planned request, 200 body) -> the worst cosine of its vectors to the references
Check = Callable[[Planned, bytes], float]
MinCosine = Callable[[str], float]  # model -> the least cosine a correct answer has


def body(request: Planned, texts: Sequence[str]) -> bytes:
    inputs = [texts[i] for i in request.inputs]
    return json.dumps(
        {"model": request.model, "input": inputs, "encoding_format": "base64"}
    ).encode()


class OpenLoop:
    """Sends ``planned`` against ``url`` from ``start()``; ``answers`` in arrival order."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        planned: Sequence[Planned],
        texts: Sequence[str],
        check: Check,
        bound: MinCosine,
        deadline_ms: float,
    ) -> None:
        self.session, self.url, self.planned = session, url, planned
        self.texts, self.check, self.bound = texts, check, bound
        self.headers = {
            "content-type": "application/json",
            "x-request-timeout-ms": str(int(deadline_ms)),
        }
        self.answers: list[Answer] = []
        self.started = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.started

    async def run(self) -> list[Answer]:
        """Every planned request sent at its time; returns once the last is answered."""
        self.started = time.monotonic()
        sent: list[asyncio.Task[None]] = []
        for request in self.planned:
            wait = request.at_s - self.now()
            if wait > 0:
                await asyncio.sleep(wait)
            sent.append(asyncio.create_task(self._one(request)))
        await asyncio.gather(*sent)
        return self.answers

    async def _one(self, request: Planned) -> None:
        try:
            async with self.session.post(
                self.url, data=body(request, self.texts), headers=self.headers
            ) as response:
                payload = await response.read()
                status = response.status
                # HTTP header names are case-insensitive; a plain dict of them is not.
                retry = response.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError) as exc:
            detail = str(exc)[:200] or f"no answer after {self.now() - request.at_s:.1f} s"
            self.answers.append(
                Answer(request.model, request.at_s, self.now(), type(exc).__name__, detail)
            )
            return
        self.answers.append(self._judged(request, status, retry, payload))

    def _judged(self, request: Planned, status: int, retry: str | None, payload: bytes) -> Answer:
        done = self.now()
        if status != 200:
            detail = error_message(payload, {"Retry-After": retry} if retry else {})
            return Answer(request.model, request.at_s, done, str(status), detail, retry)
        try:
            cosine = self.check(request, payload)
        except (ValueError, KeyError, TypeError) as exc:  # an unreadable 200 is a wrong one
            return Answer(request.model, request.at_s, done, WRONG, f"unreadable: {exc!r}"[:200])
        if cosine < self.bound(request.model):
            detail = f"worst cosine {cosine:.5f} to the references"
            return Answer(request.model, request.at_s, done, WRONG, detail, cosine=cosine)
        return Answer(request.model, request.at_s, done, OK, cosine=cosine)
