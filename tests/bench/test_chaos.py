"""The chaos benchmark's pure parts: which phase an answer counts in, the rates, the
recovery time, the table, and the faults each broker gets in turn."""

from __future__ import annotations

import math

import pytest

from bench.chaos.accounting import (
    Answer,
    Arrivals,
    Phase,
    in_phase,
    messages_text,
    outcomes,
    phase_table,
    recovery_s,
    summarize,
)
from bench.chaos.faults import FAULTS, faults_for
from bench.chaos.load import error_message


def steady_answers(
    start_s: float, end_s: float, per_s: int, latency_s: float = 0.05
) -> list[Answer]:
    """``per_s`` correct answers arriving each second, evenly, each half a gap off the
    whole steps (so no arrival sits on a window's edge)."""
    count = round((end_s - start_s) * per_s)
    arrivals = [start_s + (k + 0.5) / per_s for k in range(count)]
    return [Answer(at - latency_s, at, "200") for at in arrivals]


def test_an_answer_counts_in_the_phase_its_request_was_sent_in() -> None:
    phase = Phase("fault", 10.0, 20.0, 11.0, 14.0)
    late = Answer(19.9, 35.0, "504")  # sent in the phase, answered long after it
    early = Answer(9.9, 10.5, "200")  # answered in the phase, sent before it
    assert in_phase([late, early], phase) == [late]


def test_outcomes_count_by_status_most_frequent_first() -> None:
    answers = [Answer(0, 1, "200"), Answer(0, 1, "503"), Answer(0, 1, "200")]
    assert list(outcomes(answers).items()) == [("200", 2), ("503", 1)]


def test_the_rate_counts_correct_answers_by_arrival() -> None:
    answers = [Answer(0.0, 0.5, "200"), Answer(0.0, 1.5, "200"), Answer(0.0, 1.6, "wrong"),
               Answer(0.0, 1.7, "503")]  # fmt: skip
    arrivals = Arrivals(answers)
    assert arrivals.rate(0.0, 2.0) == 1.0
    assert arrivals.rate(1.0, 2.0) == 1.0  # the wrong vectors and the 503 do not count
    assert arrivals.rate(2.0, 2.0) == 0.0


def test_recovery_is_zero_when_throughput_never_fell() -> None:
    arrivals = Arrivals(steady_answers(0.0, 30.0, 10))
    assert recovery_s(arrivals, 10.0, 30.0, 10.0, window_s=5.0) == 0.0


def test_recovery_is_the_start_of_the_first_window_back_at_ninety_percent() -> None:
    # 10/s steady, nothing from 10 s to 16 s, 10/s again from 16.05 s: the first 2 s
    # window holding 18 answers starts at 15.8 s, 5.8 s after the broker's return at 10 s.
    answers = steady_answers(0.0, 10.0, 10) + steady_answers(16.0, 30.0, 10)
    got = recovery_s(Arrivals(answers), 10.0, 30.0, 10.0, window_s=2.0)
    assert got == pytest.approx(5.8)


def test_a_window_below_ninety_percent_is_not_recovery() -> None:
    answers = steady_answers(0.0, 10.0, 10) + steady_answers(10.0, 30.0, 8)
    assert recovery_s(Arrivals(answers), 10.0, 30.0, 10.0, window_s=2.0) is None


def test_recovery_must_fit_its_window_before_the_phase_ends() -> None:
    answers = steady_answers(0.0, 10.0, 10) + steady_answers(27.0, 30.0, 10)
    arrivals = Arrivals(answers)
    assert recovery_s(arrivals, 10.0, 30.0, 10.0, window_s=2.0) == pytest.approx(16.8)
    assert recovery_s(arrivals, 10.0, 30.0, 10.0, window_s=5.0) is None


def run_with_one_fault() -> tuple[list[Answer], list[Phase]]:
    answers = steady_answers(0.0, 10.0, 10)
    answers += [Answer(10.5, 10.6, "503", "the queue refused it (Retry-After: 5)")] * 3
    answers += [Answer(11.0, 26.0, "504", "not taken in time")]
    answers += steady_answers(14.0, 30.0, 10, latency_s=0.1)
    phases = [Phase("steady", 0.0, 10.0), Phase("broker-kill", 10.0, 30.0, 10.2, 13.0)]
    return answers, phases


def test_summarize_gives_each_phase_its_outcomes_rates_latency_and_recovery() -> None:
    answers, phases = run_with_one_fault()
    steady, fault = summarize(answers, phases, window_s=2.0)
    assert steady["outcomes"] == {"200": 100}
    assert steady["ok_per_s"] == pytest.approx(10.0)
    assert steady["p50_ms"] == pytest.approx(50.0)
    assert steady["recovery_s"] is None and steady["errors_between_s"] is None
    assert fault["outcomes"] == {"200": 160, "503": 3, "504": 1}
    assert fault["error_share"] == pytest.approx(4 / 164)
    assert fault["p99_ms"] == pytest.approx(100.0)
    assert fault["recovery_s"] == pytest.approx(0.8)  # 10/s again from 14 s, back at 13 s
    assert fault["errors_between_s"] == [10.5, 26.0]
    assert fault["messages"]["503"] == ["3x the queue refused it (Retry-After: 5)"]


def test_the_table_and_the_messages_name_every_phase() -> None:
    rows = summarize(*run_with_one_fault(), window_s=2.0)
    table = phase_table(rows)
    assert "steady" in table and "broker-kill" in table and "200:160 503:3 504:1" in table
    text = messages_text(rows)
    assert "broker-kill: error answers between 10.5 s and 26.0 s" in text
    assert "504: 1x not taken in time" in text


def test_a_phase_without_answers_has_no_latency() -> None:
    rows = summarize([], [Phase("steady", 0.0, 10.0)])
    assert rows[0]["requests"] == 0 and math.isnan(rows[0]["p99_ms"])


def test_a_cluster_gets_every_fault_and_a_server_all_but_the_rolling_restart() -> None:
    assert faults_for(cluster=True) == ["broker-kill", "rolling-restart", "worker-kill-in-outage"]
    assert faults_for(cluster=False) == ["broker-kill", "worker-kill-in-outage"]
    assert set(faults_for(cluster=True)) <= set(FAULTS)


def test_an_error_answer_says_what_its_body_said_in_either_shape() -> None:
    openai = b'{"error": {"message": "the queue refused it", "type": "not_ready", "code": 503}}'
    assert error_message(openai, {"Retry-After": "5"}) == "the queue refused it (Retry-After: 5)"
    assert error_message(b'{"error": "too late", "error_type": "x"}', {}) == "too late"
    assert error_message(b"<html>bad gateway</html>", {}) == "<html>bad gateway</html>"
