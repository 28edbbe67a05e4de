"""Text recognition's host side, as PP-OCR does it: line crops in, text out.

Each line is cut from the full-resolution page along its quadrilateral with a
perspective warp (a rotated line comes out level; a crop much taller than wide, a
vertical line, is turned), resized to the recognizer's height keeping its aspect, and
padded on the right with zeros (the normalized mid-grey PP-OCR was trained with) to the
widest line of its batch. The recognizer's per-column character probabilities are
decoded greedily (CTC: repeats merged, blanks dropped); a line's confidence is the mean
probability of the characters it kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np
from numpy.typing import NDArray

from embedder.tasks.ocr.detect import Quad

# Wider lines are squeezed to this: bounds one batch's memory for a line across a poster.
MAX_LINE_WIDTH = 3200
BLANK = 0  # CTC's blank is index 0, as PaddleOCR's dictionaries are laid out


def crop_line(pixels: NDArray[np.uint8], quad: Quad) -> NDArray[np.uint8]:
    def side(a: int, b: int) -> float:
        return float(np.linalg.norm(quad[a] - quad[b]))

    width = max(1, round(max(side(0, 1), side(3, 2))))
    height = max(1, round(max(side(0, 3), side(1, 2))))
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float32)
    warp = cv2.getPerspectiveTransform(quad.astype(np.float32), target)
    crop = cv2.warpPerspective(
        pixels, warp, (width, height), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC
    )
    if height >= 1.5 * width:
        crop = np.ascontiguousarray(np.rot90(crop))
    return np.asarray(crop, dtype=np.uint8)


def line_width(crop: NDArray[np.uint8], height: int) -> int:
    """The crop's width once resized to ``height``."""
    h, w = crop.shape[:2]
    return max(1, min(MAX_LINE_WIDTH, math.ceil(height * int(w) / max(1, int(h)))))


def recognition_input(
    crops: Sequence[NDArray[np.uint8]], widths: Sequence[int], height: int
) -> NDArray[np.float32]:
    batch = np.zeros((len(crops), 3, height, max(widths)), dtype=np.float32)
    for i, (crop, width) in enumerate(zip(crops, widths, strict=True)):
        resized = cv2.resize(crop, (width, height), interpolation=cv2.INTER_LINEAR)
        batch[i, :, :, :width] = (resized.astype(np.float32) / 255.0 - 0.5).transpose(2, 0, 1) / 0.5
    return batch


def ctc_decode(
    probabilities: NDArray[np.float32], characters: Sequence[str]
) -> list[tuple[str, float]]:
    """(n, columns, classes) probabilities -> each row's text and confidence."""
    best = probabilities.argmax(axis=2)
    scores = probabilities.max(axis=2)
    out = []
    for ids, row_scores in zip(best, scores, strict=True):
        keep = np.ones(len(ids), dtype=bool)
        keep[1:] = ids[1:] != ids[:-1]
        keep &= ids != BLANK
        text = "".join(characters[i] if i < len(characters) else "" for i in ids[keep])
        confidence = float(row_scores[keep].mean()) if keep.any() else 0.0
        out.append((text, confidence))
    return out
