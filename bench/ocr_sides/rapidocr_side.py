"""rapidocr's own pipeline: ``RapidOCR()`` in this process, one image at a time.

This is how its README runs it: the PNG bytes in, detection, angle
classification and recognition out (recognition batches the crops of that one
image, six at a time). ONNX Runtime gets ``threads`` intra-op threads for each
of the three models, as the served side's runtime gets ``--threads``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bench.ocr_data.pageset import Sample
from bench.ocr_data.render import Box
from bench.ocr_data.score import PredictedLine, Prediction
from bench.ocr_sides.results import Outcome


def engine(threads: int) -> Any:
    from rapidocr_onnxruntime import RapidOCR

    return RapidOCR(
        det_intra_op_num_threads=threads,
        cls_intra_op_num_threads=threads,
        rec_intra_op_num_threads=threads,
    )


def bounds(points: Sequence[Sequence[float]]) -> Box:
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return int(min(xs)), int(min(ys)), int(max(xs)), int(max(ys))


def to_prediction(result: Sequence[Sequence[Any]] | None) -> Prediction:
    """rapidocr's ``[[quad, text, score], ...]`` (None when it found no text), in its
    own order (top to bottom, left to right within a row)."""
    lines = tuple(
        PredictedLine(str(text), bounds(quad), float(confidence))
        for quad, text, confidence in (result or [])
    )
    return Prediction("\n".join(line.text for line in lines), lines)


def predict(ocr: Any, png: bytes) -> Prediction:
    result, _elapsed = ocr(png)
    return to_prediction(result)


def run(ocr: Any, samples: Sequence[Sample], requests: int) -> list[Outcome]:
    """``requests`` pages (cycling through ``samples``), one after the other."""
    outcomes: list[Outcome] = []
    for k in range(requests):
        index = k % len(samples)
        sent = time.perf_counter()
        try:
            prediction: Prediction | None = predict(ocr, samples[index].png)
            error = None
        except Exception as exc:  # a failed page is a row's error, not the run's end
            prediction, error = None, f"{type(exc).__name__}: {exc}"
        outcomes.append(Outcome(index, sent, time.perf_counter(), prediction, error))
    return outcomes
