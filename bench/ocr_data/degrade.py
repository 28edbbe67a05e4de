"""What scans and phone photos do to a page, applied to a rendered one.

Each condition maps (image, lines) to the degraded image and the lines' boxes
on it. Only rotation moves the ink; its boxes are the axis-aligned bounds of
each rotated box, so they still contain their line. Amounts are drawn from the
sample's own generator, so a sample is the same on every run.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageFilter

from bench.ocr_data.render import Box, Line

Degrade = Callable[
    [Image.Image, tuple[Line, ...], random.Random], tuple[Image.Image, tuple[Line, ...]]
]


def clean(
    image: Image.Image, lines: tuple[Line, ...], rng: random.Random
) -> tuple[Image.Image, tuple[Line, ...]]:
    return image, lines


def rotate_point(
    x: float, y: float, angle_deg: float, size: tuple[int, int], new_size: tuple[int, int]
) -> tuple[float, float]:
    """Where ``(x, y)`` lands when Pillow rotates an image of ``size`` by ``angle_deg``
    (counter-clockwise) about its centre with ``expand=True`` into ``new_size``."""
    a = math.radians(angle_deg)
    dx, dy = x - size[0] / 2, y - size[1] / 2
    # y points down, so a counter-clockwise turn on screen is this matrix
    return (
        new_size[0] / 2 + dx * math.cos(a) + dy * math.sin(a),
        new_size[1] / 2 - dx * math.sin(a) + dy * math.cos(a),
    )


def rotate_box(box: Box, angle_deg: float, size: tuple[int, int], new_size: tuple[int, int]) -> Box:
    corners = [
        rotate_point(x, y, angle_deg, size, new_size)
        for x in (box[0], box[2])
        for y in (box[1], box[3])
    ]
    xs, ys = [c[0] for c in corners], [c[1] for c in corners]
    return (
        max(0, math.floor(min(xs))),
        max(0, math.floor(min(ys))),
        min(new_size[0], math.ceil(max(xs))),
        min(new_size[1], math.ceil(max(ys))),
    )


def rotated(
    image: Image.Image, lines: tuple[Line, ...], rng: random.Random
) -> tuple[Image.Image, tuple[Line, ...]]:
    """A page fed in crooked: 1.5 to 4 degrees either way."""
    angle = rng.uniform(1.5, 4.0) * rng.choice((-1, 1))
    corner = image.getpixel((0, 0))
    turned = image.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=corner)
    boxes = [rotate_box(line.box, angle, image.size, turned.size) for line in lines]
    return turned, tuple(Line(line.text, box) for line, box in zip(lines, boxes, strict=True))


def _generator(rng: random.Random) -> np.random.Generator:
    return np.random.default_rng(rng.getrandbits(64))


def noisy(
    image: Image.Image, lines: tuple[Line, ...], rng: random.Random
) -> tuple[Image.Image, tuple[Line, ...]]:
    """Sensor noise: Gaussian, sigma 10 to 28 grey levels, each pixel on its own."""
    sigma = rng.uniform(10.0, 28.0)
    pixels = np.asarray(image, dtype=np.float32)
    grain = _generator(rng).normal(0.0, sigma, pixels.shape[:2])[..., None]
    out = np.clip(pixels + grain, 0, 255).astype(np.uint8)
    return Image.fromarray(out, "RGB"), lines


def blurred(
    image: Image.Image, lines: tuple[Line, ...], rng: random.Random
) -> tuple[Image.Image, tuple[Line, ...]]:
    """Out of focus: a Gaussian blur of radius 0.8 to 1.6 pixels."""
    return image.filter(ImageFilter.GaussianBlur(rng.uniform(0.8, 1.6))), lines


def jpeg(
    image: Image.Image, lines: tuple[Line, ...], rng: random.Random
) -> tuple[Image.Image, tuple[Line, ...]]:
    """Saved as a small JPEG (quality 10 to 25) and opened again: block and ringing
    artefacts around every stroke."""
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=rng.randint(10, 25))
    buffer.seek(0)
    with Image.open(buffer) as reopened:
        return reopened.convert("RGB"), lines


# condition -> how; "layout" pages (receipt, two-column) are drawn clean
CONDITIONS: dict[str, Degrade] = {
    "clean": clean,
    "rotated": rotated,
    "noisy": noisy,
    "blur": blurred,
    "jpeg": jpeg,
    "layout": clean,
}
