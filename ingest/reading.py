"""Records that carry an image or PDF are read through the same work queue as online OCR.

Each such record (``Upsert.document``, see ``ingest.records``) becomes one OCR job whose
body is the ``/v1/ocr`` request and whose answer is the ``/v1/ocr`` response
(``embedder.tasks.ocr.api``): any worker that serves the OCR model reads it, batched with the
online requests of the round. Like ingest's embedding jobs (``ingest.embedding``) it has a
long deadline and a low priority, so online requests go first.

A document's own fault (empty, truncated, over a limit, a PDF that cannot be opened, a
path outside --ocr-local-roots) is its record's dead letter with a stable code:
``document_unreadable`` (the worker's 422), ``document_too_large`` (413), else
``ocr_failed``; a retriable failure (the worker overloaded, a deadline) is tried again a
few times first, as embedding is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from embedder.core.errors import FlotillaError, InvalidRequest, LimitExceeded
from embedder.core.jobs import ApiShape, Job
from embedder.tasks.ocr.api import Routing, estimate_tokens
from embedder.queue import WorkQueue

RETRIES = 3


class _Line(msgspec.Struct):
    text: str
    bbox: list[float]
    confidence: float = 1.0


class _Page(msgspec.Struct):
    index: int
    markdown: str
    lines: list[_Line] = []
    source: str = "ocr"


class _Answer(msgspec.Struct):
    pages: list[_Page]


@dataclass(frozen=True, slots=True)
class PageLine:
    text: str
    bbox: tuple[float, float, float, float]  # pixels of the page image: x0, y0, x1, y1


@dataclass(frozen=True, slots=True)
class ReadPage:
    """One page as the OCR model read it: ``markdown`` is its text in reading order, the
    ``lines`` in that order joined by spaces, line breaks and blank lines."""

    index: int  # 0-based, as /v1/ocr's pages[].index
    markdown: str
    lines: tuple[PageLine, ...]
    source: str  # "ocr", or "text_layer" for a PDF page with text of its own


@dataclass(frozen=True, slots=True)
class ReadFailed:
    code: str  # document_unreadable | document_too_large | ocr_failed
    reason: str


def failure(error: FlotillaError) -> ReadFailed:
    if isinstance(error, LimitExceeded):
        return ReadFailed("document_too_large", f"the document is over a limit: {error.message}")
    if isinstance(error, InvalidRequest):
        return ReadFailed("document_unreadable", f"the document cannot be read: {error.message}")
    return ReadFailed("ocr_failed", f"reading the document failed: {error.message}")


def pages_of(body: bytes) -> list[ReadPage]:
    answer = msgspec.json.decode(body, type=_Answer)
    return [
        ReadPage(
            page.index,
            page.markdown,
            tuple(PageLine(line.text, _box(line.bbox)) for line in page.lines),
            page.source,
        )
        for page in answer.pages
    ]


def _box(values: list[float]) -> tuple[float, float, float, float]:
    x0, y0, x1, y1 = values
    return (x0, y0, x1, y1)


class QueueReader:
    """Puts OCR jobs on the work queue and reads their answers as pages."""

    def __init__(
        self,
        queue: WorkQueue,
        *,
        deadline_s: float = 600.0,
        bytes_per_token: float = 4.0,
        priority: int = 10,
        max_pages: int = 64,
    ) -> None:
        self.queue = queue
        self.deadline_s = deadline_s
        self.bytes_per_token = bytes_per_token
        self.priority = priority
        self.max_pages = max_pages  # sizes a job as the gateway does (one page per image)

    def _job(self, body: bytes, now: float) -> Job:
        routing = msgspec.json.decode(body, type=Routing)
        model = routing.model
        assert model is not None  # the record contract names the OCR model
        return Job.new(
            model,
            ApiShape.MISTRAL_OCR,
            body,
            now=now,
            timeout_s=self.deadline_s,
            bytes_per_token=self.bytes_per_token,
            priority=self.priority,
            est_tokens=estimate_tokens(routing, len(body), self.max_pages),
        )

    async def read(self, bodies: Sequence[bytes]) -> list[list[ReadPage] | ReadFailed]:
        """Each document's pages, or why it could not be read; all read concurrently."""
        out: list[list[ReadPage] | ReadFailed | None] = [None] * len(bodies)
        pending = list(range(len(bodies)))
        for attempt in range(RETRIES + 1):
            now = time.time()
            futures = [await self.queue.put(self._job(bodies[i], now)) for i in pending]
            results = await asyncio.gather(*futures, return_exceptions=True)
            retry: list[int] = []
            for i, result in zip(pending, results, strict=True):
                if isinstance(result, FlotillaError):
                    if result.retriable and attempt < RETRIES:
                        retry.append(i)
                    else:
                        out[i] = failure(result)
                elif isinstance(result, BaseException):
                    raise result
                else:
                    out[i] = pages_of(result.body)
            if not retry:
                break
            pending = retry
            await asyncio.sleep(0.5 * (attempt + 1))
        lost = ReadFailed("ocr_failed", "the document was not read")  # unreachable
        return [each if each is not None else lost for each in out]
