"""Text detection's host side, as PP-OCR does it: pages in, line quadrilaterals out.

A page is scaled so that its longer side fits the profile's limit (sides rounded to
multiples of 32, as the DB network needs), normalized, and padded with white to the
batch's largest page. The network's probability map is binarized; each connected region
becomes its minimum-area rectangle (so a line rotated a few degrees gets a rotated box),
kept when its mean score is high enough and grown by DB's unclip distance (area x ratio
/ perimeter: for a rectangle, its sides grow by that much on each end), then scaled back
to the page's own pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
from numpy.typing import NDArray

from embedder.tasks.ocr.spec import OcrParts

Quad = NDArray[np.float32]  # (4, 2): top-left, top-right, bottom-right, bottom-left
MIN_SIDE = 3  # pixels; thinner regions are noise


def detection_size(height: int, width: int, max_side: int) -> tuple[int, int]:
    """The (height, width) a page is detected at: scaled down to ``max_side``, never up,
    each side a multiple of 32."""
    ratio = min(1.0, max_side / max(height, width))
    return (max(32, round(height * ratio / 32) * 32), max(32, round(width * ratio / 32) * 32))


def detection_input(
    pages: Sequence[NDArray[np.uint8]],
    sizes: Sequence[tuple[int, int]],
    parts: OcrParts,
) -> NDArray[np.float32]:
    """One (n, 3, H, W) batch: each page resized to its size, padded with white."""
    tall = max(h for h, _ in sizes)
    wide = max(w for _, w in sizes)
    batch = np.full((len(pages), tall, wide, 3), 255, dtype=np.uint8)
    for i, (pixels, (h, w)) in enumerate(zip(pages, sizes, strict=True)):
        batch[i, :h, :w] = cv2.resize(pixels, (w, h), interpolation=cv2.INTER_LINEAR)
    mean = np.asarray(parts.detector_mean, dtype=np.float32)
    std = np.asarray(parts.detector_std, dtype=np.float32)
    normalized = (batch.astype(np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(normalized.transpose(0, 3, 1, 2))


def line_boxes(
    probability: NDArray[np.float32],
    size: tuple[int, int],
    page: tuple[int, int],
    parts: OcrParts,
) -> list[tuple[Quad, float]]:
    """Line quadrilaterals in the page's pixels, with their detection scores.
    ``probability`` is the network's (H, W) map of the padded batch; ``size`` the part of
    it this page filled; ``page`` the page's own (height, width)."""
    h, w = size
    region = probability[:h, :w]
    mask = cv2.dilate((region > parts.pixel_threshold).astype(np.uint8), np.ones((2, 2), np.uint8))
    contours, _ = cv2.findContours(mask, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    scale_y, scale_x = page[0] / h, page[1] / w
    found: list[tuple[Quad, float]] = []
    for contour in contours:
        centre, (bw, bh), angle = cv2.minAreaRect(contour)
        if min(bw, bh) < MIN_SIDE:
            continue
        score = _mean_score(region, _corners(centre, (bw, bh), angle))
        if score < parts.box_threshold:
            continue
        grow = bw * bh * parts.unclip_ratio / (2 * (bw + bh))
        box = _corners(centre, (bw + 2 * grow, bh + 2 * grow), angle)
        box[:, 0] = np.clip(box[:, 0] * scale_x, 0, page[1] - 1)
        box[:, 1] = np.clip(box[:, 1] * scale_y, 0, page[0] - 1)
        quad = order_corners(box)
        if min(_side(quad, 0, 1), _side(quad, 0, 3)) <= MIN_SIDE:
            continue
        found.append((quad, score))
    return found


def _corners(
    centre: Sequence[float], sides: tuple[float, float], angle: float
) -> NDArray[np.float32]:
    return np.asarray(cv2.boxPoints((centre, sides, angle)), dtype=np.float32)


def _mean_score(region: NDArray[np.float32], box: NDArray[np.float32]) -> float:
    x0, y0 = np.floor(box.min(axis=0)).astype(int)
    x1, y1 = np.ceil(box.max(axis=0)).astype(int)
    x0, y0 = max(0, x0), max(0, y0)
    x1, y1 = min(region.shape[1] - 1, x1), min(region.shape[0] - 1, y1)
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), dtype=np.uint8)
    cv2.fillPoly(mask, [(box - [x0, y0]).astype(np.int32)], 1)
    return float(cv2.mean(region[y0 : y1 + 1, x0 : x1 + 1], mask)[0])


def order_corners(box: NDArray[np.float32]) -> Quad:
    """Top-left, top-right, bottom-right, bottom-left: the two leftmost points are the
    left side (the upper one its top), the two rightmost the right side."""
    by_x = box[np.argsort(box[:, 0], kind="stable")]
    left = by_x[:2][np.argsort(by_x[:2, 1], kind="stable")]
    right = by_x[2:][np.argsort(by_x[2:, 1], kind="stable")]
    return np.array([left[0], right[0], right[1], left[1]], dtype=np.float32)


def _side(quad: Quad, a: int, b: int) -> float:
    return float(np.linalg.norm(quad[a] - quad[b]))
