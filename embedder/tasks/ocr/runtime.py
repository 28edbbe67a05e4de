"""The OCR runtime seam: two networks (detector, recognizer) on one device, and the
characters the recognizer's classes stand for. A runtime runs passes and nothing else:
batching, cropping and decoding are the engine's, the same for every runtime. Chosen by
the profile's ``runtime`` from ``OCR_RUNTIMES``, imported only when a model names it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from embedder.core.fleet import DeviceKind, ModelSpec


@dataclass(frozen=True, slots=True)
class OcrInfo:
    kind: Literal["ocr"]
    runtime: str
    device: str
    dtype: str
    detector: str  # file names, for /v1/models
    recognizer: str
    characters: int  # the recognizer's classes, blank and space included


class OcrRuntime(Protocol):
    info: OcrInfo
    characters: list[str]  # class index -> text; 0 is CTC's blank

    def detect(self, batch: NDArray[np.float32]) -> NDArray[np.float32]:
        """(n, 3, H, W) normalized pages -> (n, H, W) text probability maps."""
        ...

    def recognize(self, batch: NDArray[np.float32]) -> NDArray[np.float32]:
        """(n, 3, height, W) normalized lines -> (n, columns, classes) probabilities."""
        ...


OcrFactory = Callable[[ModelSpec, DeviceKind, int], OcrRuntime]

OCR_RUNTIMES: dict[str, str] = {"onnx": "embedder.tasks.ocr.onnx:load"}


def load_ocr(spec: ModelSpec, device: DeviceKind, threads: int) -> OcrRuntime:
    name = spec.profile(device).runtime
    target = OCR_RUNTIMES.get(name)
    if target is None:
        raise ValueError(
            f"OCR model {spec.name!r} names runtime {name!r}; OCR runs on "
            f"{', '.join(OCR_RUNTIMES)}: set 'runtime: onnx' in its profiles"
        )
    module_name, _, attr = target.partition(":")
    factory: OcrFactory = getattr(importlib.import_module(module_name), attr)
    return factory(spec, device, threads)
