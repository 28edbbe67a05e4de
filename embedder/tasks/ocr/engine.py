"""The OCR worker of one model: it pulls OCR jobs and forms its own batches.

One *round* at a time: pull what the budget holds (waiting up to ``max_wait_ms`` for
company once the first job is in), read every job's document (``documents``), then run
detection over all their page images, batched by the profile's pixel budget, and
recognition over all their text lines, batched by width, across pages and requests. A
page of 40 lines costs a couple of recognizer passes, not 40, and two requests arriving
together share them. Each pass holds a device turn (``embedder.serving.turns``) with the
round's earliest deadline, so embedders and generators on the same device take turns
with it; host work (decoding, cropping) runs between turns, on the engine's thread.

A job's own bad input fails that job alone (its classified error); a pass that raises
fails the round's jobs with ``InferenceFailed`` and the loop goes on. Jobs whose client
left, or whose deadline passed, are dropped before the round spends time on them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

import embedder.tasks.ocr.api as api
import embedder.tasks.ocr.detect as detect
import embedder.tasks.ocr.recognize as recognize
from embedder.core.errors import DeadlineExceeded, FlotillaError, InferenceFailed
from embedder.core.fleet import DeviceKind
from embedder.core.jobs import Job, JobResult, Timings
from embedder.core.lifecycle import Lifecycle, cancel_and_wait, running, watch
from embedder.queue import JobPuller
from embedder.serving import metrics
from embedder.serving.pulling import IDLE_POLL_S, fail_all, pull_or_pause, settle_departed
from embedder.serving.thread import OneThread
from embedder.serving.turns import DeviceTurns
from embedder.tasks.ocr.api import Line, OcrLimits, PageText
from embedder.tasks.ocr.batching import detection_batches, recognition_batches
from embedder.tasks.ocr.documents import Page, PageImage, PageLayer, read_document
from embedder.tasks.ocr.layout import reading_order
from embedder.tasks.ocr.runtime import OcrRuntime
from embedder.tasks.ocr.spec import OcrParts, OcrSpec

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Work:
    """One job in a round: its pages, and what has been read of them so far."""

    job: Job
    started: float
    size: int
    pages: list[Page]
    lines: dict[int, list[Line]] = field(default_factory=dict)  # position in pages -> lines


@dataclass(eq=False)
class _Crop:
    work: _Work
    at: int  # the page's position in work.pages
    quad: detect.Quad
    pixels: NDArray[np.uint8]
    width: int


class OcrEngine(Lifecycle):
    def __init__(
        self,
        queue: JobPuller,
        spec: OcrSpec,
        runtime: OcrRuntime,
        turns: DeviceTurns,
        limits: OcrLimits,
        device: DeviceKind,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        assert spec.ocr is not None
        self.queue = queue
        self.spec = spec
        self.name = spec.name
        self.parts: OcrParts = spec.ocr
        self.runtime = runtime
        self.turns = turns
        self.limits = limits
        self.profile = spec.profile(device)
        self.clock = clock
        self.held: list[Job] = []  # pulled, not yet completed: stop() fails these
        self._thread = OneThread("ocr")
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = watch(asyncio.create_task(self._loop(), name=f"ocr-{self.name}"))

    def running(self) -> bool:
        return running(self._task)

    def in_hand(self) -> int:
        return len(self.held)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        jobs, self.held = self.held, []
        self._thread.close()
        await fail_all(self.queue, jobs, DeadlineExceeded("the worker stopped"))

    # -- the loop ---------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            self.held = await self._pull()
            if not self.held:
                continue
            try:
                await self.run_round(self.held)
            except Exception as exc:  # a model failure fails its round, not the loop
                log.exception("OCR pass failed on %s", self.name)
                error = InferenceFailed(f"model {self.name!r} failed on this batch: {exc!r}")
                await fail_all(self.queue, self.held, error)
            self.held = []

    async def _pull(self) -> list[Job]:
        budget, most = self.profile.max_batch_tokens, self.profile.max_batch_requests
        # Held as they come, so that stop() (an eviction) fails none of them silently.
        jobs = self.held = await pull_or_pause(self.queue, [self.name], budget, IDLE_POLL_S)
        until = self.clock() + self.profile.max_wait_ms / 1e3
        while jobs and len(jobs) < most and (left := until - self.clock()) > 0:
            room = budget - sum(job.est_tokens for job in jobs)
            if room <= 0:
                break
            more = await pull_or_pause(self.queue, [self.name], room, left)
            if not more:
                break
            jobs += more
        return jobs

    async def run_round(self, jobs: list[Job]) -> None:
        """Read, detect, recognize and answer ``jobs`` together."""
        work: list[_Work] = []
        for job in await settle_departed(self.queue, self.name, jobs, self.clock()):
            outcome = await self._thread.call(self._read, job)
            if isinstance(outcome, FlotillaError):
                metrics.JOBS.labels(self.name, type(outcome).__name__).inc()
                await self.queue.complete(job.id, outcome)
            else:
                work.append(outcome)
        if not work:
            return
        deadline = min(w.job.deadline for w in work)
        start = time.perf_counter()
        crops = await self._detect(work, deadline)
        await self._recognize(crops, deadline)
        metrics.INFERENCE_SECONDS.labels(self.name).observe(time.perf_counter() - start)
        metrics.BATCH_REQUESTS.labels(self.name).observe(len(work))
        for w in work:
            await self._complete(w)

    def _read(self, job: Job) -> _Work | FlotillaError:
        try:
            request = api.decode(job.body)
            size, pages = read_document(request, self.limits)
        except FlotillaError as exc:
            return exc
        return _Work(job, self.clock(), size, pages)

    # -- detection and recognition ------------------------------------------------------

    async def _detect(self, work: list[_Work], deadline: float) -> list[_Crop]:
        images = [
            (w, at, p) for w in work for at, p in enumerate(w.pages) if isinstance(p, PageImage)
        ]
        side = self.profile.ocr_detect_max_side
        sizes = [
            detect.detection_size(p.pixels.shape[0], p.pixels.shape[1], side) for _, _, p in images
        ]
        crops: list[_Crop] = []
        for batch in detection_batches(sizes, self.profile.ocr_detect_pixels):
            pages = [images[i][2].pixels for i in batch]
            shapes = [sizes[i] for i in batch]
            inputs = await self._thread.call(detect.detection_input, pages, shapes, self.parts)
            async with self.turns.turn(f"ocr:{self.name}", deadline):
                maps = await self._thread.call(self.runtime.detect, inputs)
            for row, i in enumerate(batch):
                owner, at, page = images[i]
                owner.lines[at] = []
                crops += await self._thread.call(self._crops, owner, at, page, maps[row], sizes[i])
        return crops

    def _crops(
        self,
        owner: _Work,
        at: int,
        page: PageImage,
        probability: NDArray[np.float32],
        size: tuple[int, int],
    ) -> list[_Crop]:
        found = detect.line_boxes(probability, size, page.pixels.shape[:2], self.parts)
        out = []
        for quad, _ in found:
            pixels = recognize.crop_line(page.pixels, quad)
            width = recognize.line_width(pixels, self.parts.line_height)
            out.append(_Crop(owner, at, quad, pixels, width))
        return out

    async def _recognize(self, crops: list[_Crop], deadline: float) -> None:
        profile = self.profile
        widths = [c.width for c in crops]
        plan = recognition_batches(
            widths, profile.ocr_recognize_lines, profile.ocr_recognize_width_ratio
        )
        for batch in plan:
            lines = [crops[i] for i in batch]
            inputs = await self._thread.call(
                recognize.recognition_input,
                [c.pixels for c in lines],
                [c.width for c in lines],
                self.parts.line_height,
            )
            async with self.turns.turn(f"ocr:{self.name}", deadline):
                probabilities = await self._thread.call(self.runtime.recognize, inputs)
            read = recognize.ctc_decode(probabilities, self.runtime.characters)
            for crop, (text, confidence) in zip(lines, read, strict=True):
                if text.strip() and confidence >= self.parts.min_confidence:
                    corners = tuple((float(x), float(y)) for x, y in crop.quad)
                    crop.work.lines[crop.at].append(Line(text.strip(), confidence, corners))

    # -- answering ------------------------------------------------------------------------

    async def _complete(self, w: _Work) -> None:
        pages = []
        for at, page in enumerate(w.pages):
            if isinstance(page, PageLayer):
                blocks = reading_order(page.lines, page.width)
                pages.append(
                    PageText(page.index, page.width, page.height, page.dpi, "text_layer", blocks)
                )
            else:
                height, width = page.pixels.shape[:2]
                blocks = reading_order(w.lines.get(at, []), width)
                pages.append(PageText(page.index, width, height, page.dpi, "ocr", blocks))
        now = self.clock()
        metrics.JOBS.labels(self.name, "ok").inc()
        result = JobResult(
            body=api.encode(self.name, pages, w.size),
            prompt_tokens=len(pages),
            timings=Timings(
                queue_s=max(0.0, w.started - w.job.enqueued_at), inference_s=now - w.started
            ),
            extra_headers={"x-pages": str(len(pages))},
        )
        await self.queue.complete(w.job.id, result)
