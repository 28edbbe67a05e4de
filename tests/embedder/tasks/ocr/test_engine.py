"""The OCR engine on the real PP-OCRv5 ONNX files: it reads rendered text, forms its own
batches (a 40-line page is not 40 recognizer passes; requests queued together share
passes), takes device turns, and a bad document fails its own job alone."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from numpy.typing import NDArray

from embedder.core.errors import FlotillaError, InvalidRequest
from embedder.core.fleet import ModelSpec
from embedder.tasks.fleet import load_fleet
from embedder.host import load_ocr
from embedder.core.jobs import ApiShape, Job, JobResult
from embedder.tasks.ocr.api import OcrLimits
from embedder.tasks.ocr.engine import OcrEngine
from embedder.tasks.ocr.runtime import OcrRuntime
from embedder.queue.inprocess import InProcessQueue
from embedder.serving.turns import DeviceTurns
from tests.embedder.tasks.ocr.samples import png_bytes, render_lines


@dataclass
class Counting:
    """The real runtime, counting its passes."""

    inner: OcrRuntime
    detect_calls: int = 0
    recognize_calls: int = 0

    @property
    def info(self):  # type: ignore[no-untyped-def]
        return self.inner.info

    @property
    def characters(self) -> list[str]:
        return self.inner.characters

    def detect(self, batch: NDArray[np.float32]) -> NDArray[np.float32]:
        self.detect_calls += 1
        return self.inner.detect(batch)

    def recognize(self, batch: NDArray[np.float32]) -> NDArray[np.float32]:
        self.recognize_calls += 1
        return self.inner.recognize(batch)


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return load_fleet().get("ppocrv5-mobile")


@pytest.fixture(scope="module")
def real_runtime(spec: ModelSpec) -> Iterator[OcrRuntime]:
    yield load_ocr(spec, "cpu", 2)


@pytest.fixture
async def engine(
    spec: ModelSpec, real_runtime: OcrRuntime
) -> AsyncIterator[tuple[OcrEngine, InProcessQueue, Counting]]:
    queue = InProcessQueue()
    runtime = Counting(real_runtime)
    engine = OcrEngine(queue, spec, runtime, DeviceTurns(), OcrLimits(), "cpu")
    yield engine, queue, runtime
    await engine.stop()


def body(png: bytes) -> bytes:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return json.dumps({"document": {"type": "image_url", "image_url": url}}).encode()


async def put(queue: InProcessQueue, data: bytes) -> asyncio.Future[JobResult]:
    job = Job.new(
        "ppocrv5-mobile", ApiShape.MISTRAL_OCR, data, now=time.time(), timeout_s=60,
        bytes_per_token=4, est_tokens=1000,
    )  # fmt: skip
    return await queue.put(job)


async def test_a_page_of_forty_lines_takes_two_recognizer_passes(
    engine: tuple[OcrEngine, InProcessQueue, Counting],
) -> None:
    ocr, queue, runtime = engine
    lines = [f"Line {i}: the quick brown fox jumps." for i in range(40)]
    pending = await put(queue, body(png_bytes(render_lines(lines, size=22))))
    await ocr.start()
    page = json.loads((await asyncio.wait_for(pending, 60)).body)["pages"][0]
    read = page["markdown"].split("\n")
    assert len(read) == 40 and len(page["lines"]) == 40
    assert sum(a == b for a, b in zip(read, lines, strict=True)) >= 36  # a "0" may read "O"
    assert runtime.detect_calls == 1
    assert runtime.recognize_calls == 2  # 32 + 8 lines (profile: ocr_recognize_lines 32)


async def test_requests_queued_together_share_passes_and_a_bad_one_fails_alone(
    engine: tuple[OcrEngine, InProcessQueue, Counting],
) -> None:
    ocr, queue, runtime = engine
    texts = [["Invoice number 4711"], ["Total amount 12.50 EUR"], ["Thank you for shopping"]]
    pages = [png_bytes(render_lines(t)) for t in texts]
    pending = [await put(queue, body(p)) for p in pages]
    broken = await put(queue, body(pages[0][:100]))
    await ocr.start()
    answers = [json.loads((await asyncio.wait_for(p, 60)).body) for p in pending]
    assert [a["pages"][0]["markdown"] for a in answers] == [t[0] for t in texts]
    assert runtime.detect_calls == 1 and runtime.recognize_calls == 1  # one pass for all
    with pytest.raises(InvalidRequest, match="truncated or corrupt"):
        await broken


async def test_a_failing_pass_fails_its_round_and_the_engine_goes_on(
    engine: tuple[OcrEngine, InProcessQueue, Counting],
) -> None:
    ocr, queue, runtime = engine
    page = png_bytes(render_lines(["Still serving"]))
    inner = runtime.inner

    class Broken:
        info, characters = inner.info, inner.characters

        def detect(self, batch: NDArray[np.float32]) -> NDArray[np.float32]:
            raise RuntimeError("device lost")

    runtime.inner = Broken()  # type: ignore[assignment]
    failed = await put(queue, body(page))
    await ocr.start()
    with pytest.raises(FlotillaError, match="device lost"):
        await asyncio.wait_for(failed, 30)
    runtime.inner = inner
    answer = json.loads((await asyncio.wait_for(await put(queue, body(page)), 30)).body)
    assert answer["pages"][0]["markdown"] == "Still serving"
