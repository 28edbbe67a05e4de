"""PullerState: what a Kafka puller may do after each sequence of events its consumer and
its worker can produce. No broker needed."""

from __future__ import annotations

import dataclasses

import pytest

from embedder.queue.kafka.puller_state import Phase, PullerState

FRESH = PullerState()


def test_a_fresh_puller_hands_out_nothing_and_would_still_answer() -> None:
    assert (FRESH.phase, FRESH.hands_out, FRESH.answers) == (Phase.JOINING, False, True)


def test_the_first_join_assigned_inside_start_serves_once_start_returns() -> None:
    inside_start = FRESH.revoking().assigned()
    assert not inside_start.hands_out  # start() has not returned yet
    assert inside_start.joined().hands_out


def test_a_join_whose_assignment_comes_after_start_waits_for_it() -> None:
    joined = FRESH.revoking().joined()
    assert joined.phase is Phase.SERVING
    assert not joined.hands_out  # partitions still moving
    assert joined.assigned().hands_out


def test_a_rebalance_while_serving_pauses_handing_out() -> None:
    serving = FRESH.joined()
    assert not serving.revoking().hands_out
    assert serving.revoking().assigned() == serving


def test_an_assignment_during_a_drain_does_not_resume_handing_out() -> None:
    draining = FRESH.joined().revoking().draining()
    assert draining.phase is Phase.DRAINING
    assert not draining.assigned().hands_out
    assert draining.assigned().answers


def test_after_a_drain_ends_nothing_is_answered_and_nothing_revives_it() -> None:
    abandoned = FRESH.joined().draining().abandoned()
    assert (abandoned.hands_out, abandoned.answers) == (False, False)
    for later in (
        abandoned.stopped(),
        abandoned.draining(),
        abandoned.joined(),  # a start after the drain
        abandoned.revoking().assigned(),
    ):
        assert later.phase is Phase.ABANDONED
        assert not later.hands_out


def test_a_stop_without_a_drain_still_answers_but_hands_out_nothing_again() -> None:
    stopped = FRESH.joined().stopped()
    assert (stopped.phase, stopped.hands_out, stopped.answers) == (Phase.STOPPED, False, True)
    assert not stopped.joined().assigned().hands_out  # started again: still inert
    assert stopped.draining().abandoned().answers is False


def test_a_drain_before_start_leaves_the_puller_inert() -> None:
    drained = FRESH.draining().abandoned()
    assert not drained.joined().hands_out


def test_the_state_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        FRESH.phase = Phase.SERVING  # type: ignore[misc]
