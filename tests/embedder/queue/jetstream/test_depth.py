"""Which of its models a worker fetches from: the deepest queue, the most urgent head
among equals, none when no queue has a request waiting."""

from __future__ import annotations

import math

from embedder.queue.jetstream.fetcher import Depth, deepest


def test_no_model_is_chosen_while_none_has_a_request_waiting() -> None:
    assert deepest({}) is None
    assert deepest({"alpha": Depth(0, 1.0), "beta": Depth(0, 2.0, head_deadline=5.0)}) is None


def test_the_model_with_the_most_requests_waiting_is_chosen() -> None:
    depths = {
        "alpha": Depth(2, 0.0, head_deadline=1.0),
        "beta": Depth(5, 0.0),
        "gamma": Depth(0, 0.0),
    }
    assert deepest(depths) == "beta"


def test_among_equally_deep_queues_the_earliest_head_deadline_wins() -> None:
    assert deepest({"alpha": Depth(3, 0.0, 10.0), "beta": Depth(3, 0.0, 5.0)}) == "beta"
    # A queue whose head was never seen is the less urgent of two.
    assert deepest({"alpha": Depth(3, 0.0, 5.0), "beta": Depth(3, 0.0, math.inf)}) == "alpha"
