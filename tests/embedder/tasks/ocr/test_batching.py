"""The OCR worker's batch plans: every item exactly once, within its budgets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from embedder.tasks.ocr.batching import MIN_FILL, detection_batches, recognition_batches

sides = st.integers(min_value=32, max_value=2048).map(lambda n: n // 32 * 32)


@given(st.lists(st.tuples(sides, sides), max_size=30), st.integers(1, 8_000_000))
def test_detection_batches_cover_each_page_once_within_the_pixel_budget(
    shapes: list[tuple[int, int]], budget: int
) -> None:
    batches = detection_batches(shapes, budget)
    assert sorted(i for batch in batches for i in batch) == list(range(len(shapes)))
    for batch in batches:
        tall = max(shapes[i][0] for i in batch)
        wide = max(shapes[i][1] for i in batch)
        assert len(batch) == 1 or len(batch) * tall * wide <= budget
        assert all(shapes[i][0] * shapes[i][1] >= MIN_FILL * tall * wide for i in batch)


def test_pages_of_one_shape_share_passes() -> None:
    assert detection_batches([(1280, 928)] * 5, 4_000_000) == [[0, 1, 2], [3, 4]]
    # a small receipt does not ride along, padded to a page
    assert detection_batches([(1280, 928), (320, 256)], 4_000_000) == [[1], [0]]


@given(
    st.lists(st.integers(1, 3200), max_size=200),
    st.integers(1, 64),
    st.floats(1.0, 4.0),
)
def test_recognition_batches_cover_each_line_once_by_similar_width(
    widths: list[int], most: int, ratio: float
) -> None:
    batches = recognition_batches(widths, most, ratio)
    assert sorted(i for batch in batches for i in batch) == list(range(len(widths)))
    for batch in batches:
        assert len(batch) <= most
        assert max(widths[i] for i in batch) <= ratio * min(widths[i] for i in batch)


def test_forty_lines_of_a_page_take_two_passes() -> None:
    widths = [700 + 5 * i for i in range(40)]
    assert [len(b) for b in recognition_batches(widths, 32, 2.0)] == [32, 8]
