"""How the OCR worker groups its passes: pages for detection, text lines for recognition.

Both are pure functions of the sizes and the profile's budgets, and both keep one
invariant: every item is in exactly one batch, in no batch beyond its budget (an item
over the budget on its own runs alone). The worker pads each batch to its largest item,
so items are sorted by size first and grouped with their neighbours: little padding,
few passes.
"""

from __future__ import annotations

from collections.abc import Sequence

# A page joins a detection batch only while it fills at least this share of the padded
# area it is given: past it, padding costs more than the extra pass it saves.
MIN_FILL = 0.5


def detection_batches(shapes: Sequence[tuple[int, int]], max_pixels: int) -> list[list[int]]:
    """Indices of ``shapes`` ((height, width) after resizing), grouped so that each
    batch's padded size (count x tallest x widest) stays within ``max_pixels``."""
    order = sorted(range(len(shapes)), key=lambda i: (shapes[i][0], shapes[i][1]))
    batches: list[list[int]] = []
    height = width = 0
    for i in order:
        h, w = shapes[i]
        if batches:
            tall, wide = max(height, h), max(width, w)
            batch = batches[-1]
            fills = all(shapes[j][0] * shapes[j][1] >= MIN_FILL * tall * wide for j in [*batch, i])
            if (len(batch) + 1) * tall * wide <= max_pixels and fills:
                batch.append(i)
                height, width = tall, wide
                continue
        batches.append([i])
        height, width = h, w
    return batches


def recognition_batches(
    widths: Sequence[int], max_lines: int, width_ratio: float
) -> list[list[int]]:
    """Indices of ``widths`` (text lines at the recognizer's height), narrowest first,
    at most ``max_lines`` a batch, the widest of each at most ``width_ratio`` times its
    narrowest."""
    order = sorted(range(len(widths)), key=lambda i: widths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches:
            batch = batches[-1]
            if len(batch) < max_lines and widths[i] <= width_ratio * max(1, widths[batch[0]]):
                batch.append(i)
                continue
        batches.append([i])
    return batches
