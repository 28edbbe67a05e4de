"""Which of its queues a worker fetches from: the most urgent lane with a request
waiting; among those the most waiting work (requests waiting times how long since this
worker served the lane), then the deeper queue, then the most urgent head; none when no
queue has a request waiting."""

from __future__ import annotations

import math

from embedder.queue.jetstream.config import JetStreamConfig, Lane
from embedder.queue.jetstream.fetcher import Depth, deepest

ALPHA, BETA, GAMMA = Lane("alpha", 0), Lane("beta", 0), Lane("gamma", 0)


def test_no_queue_is_chosen_while_none_has_a_request_waiting() -> None:
    assert deepest({}, 1.0) is None
    assert deepest({ALPHA: Depth(0, 1.0), BETA: Depth(0, 2.0, head_deadline=5.0)}, 3.0) is None


def test_among_models_served_alike_the_deepest_is_chosen() -> None:
    depths = {
        ALPHA: Depth(2, 0.0, head_deadline=1.0, served_at=0.0),
        BETA: Depth(5, 0.0, served_at=0.0),
        GAMMA: Depth(0, 0.0, served_at=0.0),
    }
    assert deepest(depths, 1.0) == BETA


def test_a_shallow_queue_left_long_unserved_gets_its_turn() -> None:
    popular, rare = Lane("popular", 0), Lane("rare", 0)
    depths = {
        popular: Depth(10, 5.0, served_at=4.9),  # 10 waiting, served 0.1 s ago
        rare: Depth(1, 5.0, served_at=3.0),  # 1 waiting, not served for 2 s
    }
    assert deepest(depths, 5.0) == rare
    # Once served, the deep queue comes first again.
    assert deepest({**depths, rare: Depth(1, 5.0, served_at=5.0)}, 5.1) == popular


def test_a_model_never_served_comes_first_then_the_deeper() -> None:
    old, new, newer = Lane("old", 0), Lane("new", 0), Lane("newer", 0)
    depths = {old: Depth(9, 0.0, served_at=0.0), new: Depth(1, 0.0), newer: Depth(2, 0.0)}
    assert deepest(depths, 1.0) == newer


def test_among_equally_deep_queues_the_earliest_head_deadline_wins() -> None:
    assert deepest({ALPHA: Depth(3, 0.0, 10.0, 0.0), BETA: Depth(3, 0.0, 5.0, 0.0)}, 1.0) == BETA
    # A queue whose head was never seen is the less urgent of two.
    assert (
        deepest({ALPHA: Depth(3, 0.0, 5.0, 0.0), BETA: Depth(3, 0.0, math.inf, 0.0)}, 1.0) == ALPHA
    )


def test_the_most_urgent_lane_with_requests_waiting_comes_first() -> None:
    config = JetStreamConfig.model_validate({"nats_deadline_lanes_ms": "2000,8000"})
    urgent, standard, batch = config.lanes("alpha")
    depths = {
        urgent: Depth(1, 0.0, served_at=0.9),  # one request, served just now
        standard: Depth(50, 0.0, served_at=0.0),
        Lane("beta", 2): Depth(500, 0.0),  # deep, never served, but in the last lane
    }
    assert deepest(depths, 1.0) == urgent
    assert deepest({**depths, urgent: Depth(0, 1.0)}, 1.0) == standard
    assert batch.index == 2 and deepest({batch: Depth(1, 0.0)}, 1.0) == batch


def test_a_request_goes_to_the_lane_of_its_time_budget() -> None:
    config = JetStreamConfig.model_validate({"nats_deadline_lanes_ms": "2000,8000"})
    assert [config.lane_of("m", s).index for s in (0.5, 2.0, 2.001, 8.0, 30.0)] == [0, 0, 1, 1, 2]
    # The last lane is the model's own subject and consumer, as without lanes.
    assert config.lane_subject(config.lanes("m")[-1]) == config.subject("m")
    assert config.lane_consumer(config.lanes("m")[-1]) == config.consumer("m")
    assert len({config.lane_subject(lane) for lane in config.lanes("m")}) == 3
    # No lane's consumer is another model's, whatever its name.
    assert config.lane_consumer(Lane("m", 0)) != config.consumer("m_d0")
    assert JetStreamConfig().lanes("m") == [Lane("m", 0)]
