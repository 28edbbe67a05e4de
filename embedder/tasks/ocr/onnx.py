"""The OCR runtime on ONNX Runtime: a PP-OCR detector and recognizer as ONNX files.

The characters come from the fleet's dictionary file or, for PaddleOCR exports that
carry it, the recognizer's ``character`` metadata; CTC's blank goes first and a space
last, as PaddleOCR lays them out, and their count must match the recognizer's classes
(a dictionary of another model is refused at load, not read as garbage). Both networks
run float32: ONNX Runtime's CPU provider has no bf16, and int8 would move the text.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

from embedder.core.fleet import DeviceKind, ModelSpec
from embedder.tasks.ocr.runtime import OcrInfo

log = logging.getLogger(__name__)


class OnnxOcr:
    def __init__(self, spec: ModelSpec, device: DeviceKind, threads: int) -> None:
        assert spec.ocr is not None and spec.source.file is not None  # the spec checks it
        dtype = spec.profile(device).dtype
        if dtype not in ("auto", "float32"):
            raise ValueError(
                f"OCR model {spec.name!r}: runtime onnx runs float32 (or auto), not {dtype!r}"
            )
        folder = spec.source.resolve()
        detector = folder / spec.ocr.detector
        recognizer = folder / spec.source.file
        if not detector.is_file():
            raise FileNotFoundError(f"OCR model {spec.name!r}: no detector at {detector}")
        providers = ["CPUExecutionProvider"]
        if device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise ValueError(
                    f"OCR model {spec.name!r} on cuda needs ONNX Runtime's CUDA provider: "
                    "pip install onnxruntime-gpu (or run it with --device cpu)"
                )
            providers.insert(0, "CUDAExecutionProvider")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._detector = ort.InferenceSession(str(detector), options, providers=providers)
        self._recognizer = ort.InferenceSession(str(recognizer), options, providers=providers)
        self.characters = _characters(spec, folder, self._recognizer)
        self.info = OcrInfo(
            kind="ocr",
            runtime="onnx",
            device=device,
            dtype="float32",
            detector=detector.name,
            recognizer=recognizer.name,
            characters=len(self.characters),
        )

    def detect(self, batch: NDArray[np.float32]) -> NDArray[np.float32]:
        name = self._detector.get_inputs()[0].name
        maps: NDArray[np.float32] = self._detector.run(None, {name: batch})[0]
        return maps[:, 0]

    def recognize(self, batch: NDArray[np.float32]) -> NDArray[np.float32]:
        name = self._recognizer.get_inputs()[0].name
        probabilities: NDArray[np.float32] = self._recognizer.run(None, {name: batch})[0]
        return probabilities


def _characters(spec: ModelSpec, folder: Path, session: ort.InferenceSession) -> list[str]:
    assert spec.ocr is not None
    if spec.ocr.characters is not None:
        text = (folder / spec.ocr.characters).read_text(encoding="utf-8")
        listed = text.split("\n")
        if listed and listed[-1] == "":
            listed.pop()  # the file's last newline
    else:
        meta = session.get_modelmeta().custom_metadata_map.get("character")
        if meta is None:
            raise ValueError(
                f"OCR model {spec.name!r}: its recognizer carries no character list; name "
                "the dictionary file in 'ocr: {characters: ...}'"
            )
        listed = meta.splitlines()
    characters = ["", *[c.rstrip("\r") for c in listed], " "]
    classes = session.get_outputs()[0].shape[-1]
    if isinstance(classes, int) and classes != len(characters):
        raise ValueError(
            f"OCR model {spec.name!r}: the recognizer has {classes} classes but its "
            f"characters make {len(characters)} (blank and space included): the dictionary "
            "belongs to another model"
        )
    return characters


def load(spec: ModelSpec, device: DeviceKind, threads: int) -> OnnxOcr:
    runtime = OnnxOcr(spec, device, threads)
    log.info("%s: %s", spec.name, runtime.info)
    return runtime
