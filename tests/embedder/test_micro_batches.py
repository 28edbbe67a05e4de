"""micro_batches (embedder.tasks.embed.batching): how a runtime splits one batch into forward passes."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from embedder.tasks.embed.batching import micro_batches

lengths_lists = st.lists(st.integers(1, 600), max_size=60)
token_budgets = st.integers(1, 4096)
sequence_caps = st.integers(1, 64)
EXAMPLES = settings(max_examples=300, deadline=None)


def padded(lengths: list[int], rows: list[int]) -> int:
    return len(rows) * max(lengths[i] for i in rows)


@EXAMPLES
@given(lengths_lists, token_budgets, sequence_caps)
def test_every_index_appears_exactly_once(
    lengths: list[int], max_tokens: int, max_sequences: int
) -> None:
    passes = micro_batches(lengths, max_tokens, max_sequences)
    assert Counter(i for rows in passes for i in rows) == Counter(range(len(lengths)))
    assert all(rows for rows in passes)  # no empty pass


@EXAMPLES
@given(lengths_lists, token_budgets, sequence_caps)
def test_lengths_ascend_within_and_across_passes(
    lengths: list[int], max_tokens: int, max_sequences: int
) -> None:
    passes = micro_batches(lengths, max_tokens, max_sequences)
    flat = [lengths[i] for rows in passes for i in rows]
    assert flat == sorted(lengths)


@EXAMPLES
@given(lengths_lists, token_budgets, sequence_caps)
def test_each_pass_fits_the_padded_token_and_sequence_limits(
    lengths: list[int], max_tokens: int, max_sequences: int
) -> None:
    for rows in micro_batches(lengths, max_tokens, max_sequences):
        assert len(rows) <= max_sequences
        # A single over-long sequence still needs a pass of its own.
        assert padded(lengths, rows) <= max_tokens or len(rows) == 1


@EXAMPLES
@given(lengths_lists, token_budgets, sequence_caps)
def test_a_pass_closes_only_when_the_next_sequence_would_not_fit(
    lengths: list[int], max_tokens: int, max_sequences: int
) -> None:
    """Splitting more often than needed would waste forward passes."""
    passes = micro_batches(lengths, max_tokens, max_sequences)
    for rows, following in itertools.pairwise(passes):
        grown = [*rows, following[0]]
        assert len(grown) > max_sequences or padded(lengths, grown) > max_tokens


def test_no_lengths_no_passes() -> None:
    assert micro_batches([], 100, 8) == []


def test_an_example_split() -> None:
    lengths = [10, 3, 50, 4, 3]
    # Sorted: 3 (i1), 3 (i4), 4 (i3), 10 (i0), 50 (i2); 16 padded tokens per pass at most.
    assert micro_batches(lengths, max_tokens=16, max_sequences=8) == [[1, 4, 3], [0], [2]]
    assert micro_batches(lengths, max_tokens=1_000, max_sequences=2) == [[1, 4], [3, 0], [2]]
