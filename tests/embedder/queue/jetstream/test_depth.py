"""Which of its models a worker fetches from: the most waiting work (requests waiting
times how long since this worker served the model), then the deeper queue, then the
most urgent head; none when no queue has a request waiting."""

from __future__ import annotations

import math

from embedder.queue.jetstream.fetcher import Depth, deepest


def test_no_model_is_chosen_while_none_has_a_request_waiting() -> None:
    assert deepest({}, 1.0) is None
    assert deepest({"alpha": Depth(0, 1.0), "beta": Depth(0, 2.0, head_deadline=5.0)}, 3.0) is None


def test_among_models_served_alike_the_deepest_is_chosen() -> None:
    depths = {
        "alpha": Depth(2, 0.0, head_deadline=1.0, served_at=0.0),
        "beta": Depth(5, 0.0, served_at=0.0),
        "gamma": Depth(0, 0.0, served_at=0.0),
    }
    assert deepest(depths, 1.0) == "beta"


def test_a_shallow_queue_left_long_unserved_gets_its_turn() -> None:
    depths = {
        "popular": Depth(10, 5.0, served_at=4.9),  # 10 waiting, served 0.1 s ago
        "rare": Depth(1, 5.0, served_at=3.0),  # 1 waiting, not served for 2 s
    }
    assert deepest(depths, 5.0) == "rare"
    # Once served, the deep queue comes first again.
    assert deepest({**depths, "rare": Depth(1, 5.0, served_at=5.0)}, 5.1) == "popular"


def test_a_model_never_served_comes_first_then_the_deeper() -> None:
    depths = {"old": Depth(9, 0.0, served_at=0.0), "new": Depth(1, 0.0), "newer": Depth(2, 0.0)}
    assert deepest(depths, 1.0) == "newer"


def test_among_equally_deep_queues_the_earliest_head_deadline_wins() -> None:
    assert (
        deepest({"alpha": Depth(3, 0.0, 10.0, 0.0), "beta": Depth(3, 0.0, 5.0, 0.0)}, 1.0) == "beta"
    )
    # A queue whose head was never seen is the less urgent of two.
    assert (
        deepest({"alpha": Depth(3, 0.0, 5.0, 0.0), "beta": Depth(3, 0.0, math.inf, 0.0)}, 1.0)
        == "alpha"
    )
