"""OCR on the pull substrate: PP-OCR detection and recognition, batched by the worker.

``api`` is the job's contract (the ``/v1/ocr`` request in, its response out) and the only
module the gateway reads; ``documents`` turns a request into page images or a PDF's own
text; ``detect`` and ``recognize`` are PP-OCR's host-side steps (boxes from the detection
map, line crops, CTC decoding); ``batching`` groups pages and lines into passes;
``layout`` puts lines in reading order; ``runtime`` is the seam the networks run behind
(``onnx``: ONNX Runtime); ``engine`` is the loop that pulls OCR jobs and runs rounds;
``spec`` is the fleet entry and profile.
"""

from __future__ import annotations

from typing import Any

from embedder.core.fleet import DeviceKind, ModelSpec, entry_as
from embedder.core.jobs import ApiShape
from embedder.serving.per_model import ModelLoop, OneLoopPerModel
from embedder.tasks.kind import Engine, EngineContext, TaskKind
from embedder.tasks.ocr import api
from embedder.tasks.ocr.api import OcrLimits
from embedder.tasks.ocr.spec import OcrSpec


def load(spec: ModelSpec, device: DeviceKind, threads: int) -> Any:
    from embedder.tasks.ocr.runtime import load_ocr  # ONNX Runtime, OpenCV: only where OCR loads

    return load_ocr(entry_as(spec, OcrSpec), device, threads)


def make_engine(context: EngineContext) -> Engine:
    from embedder.tasks.ocr.engine import OcrEngine

    def loop(spec: ModelSpec, runtime: Any) -> ModelLoop:
        limits = context.option(OcrLimits)
        spec_ = entry_as(spec, OcrSpec)
        return OcrEngine(context.queue, spec_, runtime, context.turns, limits, context.device)

    return OneLoopPerModel(loop)


KIND = TaskKind(
    name="ocr",
    spec=OcrSpec,
    routes={"/v1/ocr": ApiShape.MISTRAL_OCR},
    bodies={ApiShape.MISTRAL_OCR: api.OcrBody},
    load=load,
    engine="ocr",
    make_engine=make_engine,
)
