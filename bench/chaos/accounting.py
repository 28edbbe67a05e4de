"""What a chaos run measured, reduced to its verdicts: the answers of each phase by
outcome, their latency, the steady throughput and the time each fault took to recover
from. Pure: answers and phases in, numbers out (no clock, no I/O).

An answer belongs to the phase in which its request was *sent*. Throughput counts
correct answers by the time they *arrived*. Recovery is measured from the moment the
broker was whole again (``Phase.back_s``) to the start of the first window of
``window_s`` in which correct answers arrived at ``share`` or more of the steady rate:
0 when throughput never fell, None when it did not come back before the phase ended."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench import report

OK = "200"
WRONG = "wrong"  # a 200 whose vectors are not the model's
RECOVERED_SHARE = 0.9
WINDOW_S = 5.0
STEP_S = 0.1  # where the sliding window may start, every this many seconds


@dataclass(frozen=True, slots=True)
class Answer:
    sent_s: float  # since the run began
    done_s: float
    outcome: str  # the HTTP status ("200", "503", ...), WRONG, or the client's exception
    detail: str = ""  # what an error answer said happened

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    @property
    def latency_ms(self) -> float:
        return (self.done_s - self.sent_s) * 1e3


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    start_s: float
    end_s: float
    fault_s: float | None = None  # when the fault began; None for the steady phase
    back_s: float | None = None  # when the broker was whole again


class Arrivals:
    """The arrival times of the correct answers, sorted once, so that each window's
    count is two bisections."""

    def __init__(self, answers: Sequence[Answer]) -> None:
        self.times = sorted(a.done_s for a in answers if a.ok)

    def rate(self, start_s: float, end_s: float) -> float:
        """Correct answers per second that arrived in [start_s, end_s)."""
        if end_s <= start_s:
            return 0.0
        lo = bisect.bisect_left(self.times, start_s)
        hi = bisect.bisect_left(self.times, end_s)
        return (hi - lo) / (end_s - start_s)


def in_phase(answers: Sequence[Answer], phase: Phase) -> list[Answer]:
    return [a for a in answers if phase.start_s <= a.sent_s < phase.end_s]


def outcomes(answers: Sequence[Answer]) -> dict[str, int]:
    """Answers by outcome, most frequent first."""
    return dict(Counter(a.outcome for a in answers).most_common())


def recovery_s(
    arrivals: Arrivals,
    back_s: float,
    until_s: float,
    steady_per_s: float,
    *,
    window_s: float = WINDOW_S,
    share: float = RECOVERED_SHARE,
) -> float | None:
    """Seconds from ``back_s`` to the first window of ``window_s`` (ending by
    ``until_s``) at ``share`` of ``steady_per_s`` or more; None if there is none."""
    target = share * steady_per_s
    steps = int((until_s - window_s - back_s) / STEP_S + 1e-9)
    for k in range(steps + 1):
        start = back_s + k * STEP_S
        if arrivals.rate(start, start + window_s) >= target:
            return round(k * STEP_S, 3)
    return None


def summarize_phase(
    answers: Sequence[Answer],
    arrivals: Arrivals,
    phase: Phase,
    steady_per_s: float,
    window_s: float = WINDOW_S,
) -> dict[str, Any]:
    """One phase's row: requests and outcomes, the error answers' messages, correct
    answers per second, p50/p99 of the correct answers and the recovery time."""
    mine = in_phase(answers, phase)
    ms = [a.latency_ms for a in mine if a.ok]
    errors = [a for a in mine if not a.ok]
    recovered = None
    if phase.back_s is not None:
        recovered = recovery_s(arrivals, phase.back_s, phase.end_s, steady_per_s, window_s=window_s)
    return {
        "phase": phase.name,
        "start_s": round(phase.start_s, 3),
        "end_s": round(phase.end_s, 3),
        "fault_s": phase.fault_s,
        "back_s": phase.back_s,
        "requests": len(mine),
        "outcomes": outcomes(mine),
        "error_share": len(errors) / len(mine) if mine else 0.0,
        "messages": _messages(errors),
        # from the first error answer's request to the last error's arrival
        "errors_between_s": (
            [round(min(a.sent_s for a in errors), 3), round(max(a.done_s for a in errors), 3)]
            if errors
            else None
        ),
        "ok_per_s": arrivals.rate(phase.start_s, phase.end_s),
        "p50_ms": report.percentile(ms, 50),
        "p99_ms": report.percentile(ms, 99),
        "recovery_s": recovered,
    }


def _messages(errors: Sequence[Answer], most: int = 3) -> dict[str, list[str]]:
    """Each error outcome's most frequent messages, so a reader sees what happened."""
    by_outcome: dict[str, Counter[str]] = {}
    for a in errors:
        by_outcome.setdefault(a.outcome, Counter())[a.detail] += 1
    return {
        outcome: [f"{n}x {text}" for text, n in counts.most_common(most)]
        for outcome, counts in by_outcome.items()
    }


def summarize(
    answers: Sequence[Answer], phases: Sequence[Phase], window_s: float = WINDOW_S
) -> list[dict[str, Any]]:
    """Every phase's row; the first phase is the steady one whose rate the others'
    recovery is measured against."""
    arrivals = Arrivals(answers)
    steady = phases[0]
    steady_per_s = arrivals.rate(steady.start_s, steady.end_s)
    return [summarize_phase(answers, arrivals, p, steady_per_s, window_s) for p in phases]


def phase_table(rows: Sequence[dict[str, Any]]) -> str:
    """The printed table of ``summarize``'s rows."""
    headers = ["phase", "requests", "answers by status", "errors %", "ok/s", "p50 ms", "p99 ms",
               "back at s", "recovery s"]  # fmt: skip
    lines = [
        [
            row["phase"],
            row["requests"],
            " ".join(f"{k}:{v}" for k, v in row["outcomes"].items()),
            100 * row["error_share"],
            row["ok_per_s"],
            row["p50_ms"],
            row["p99_ms"],
            "-" if row["back_s"] is None else f"{row['back_s']:.1f}",
            _recovery_cell(row),
        ]
        for row in rows
    ]
    return report.table(headers, lines)


def _recovery_cell(row: dict[str, Any]) -> str:
    if row["back_s"] is None:
        return "-"
    return "not recovered" if row["recovery_s"] is None else f"{row['recovery_s']:.1f}"


def messages_text(rows: Sequence[dict[str, Any]]) -> str:
    """What the error answers of each phase said, most frequent first."""
    lines = []
    for row in rows:
        if row["errors_between_s"] is not None:
            first, last = row["errors_between_s"]
            lines.append(f"{row['phase']}: error answers between {first:.1f} s and {last:.1f} s")
        lines += [
            f"  {outcome}: {message}"
            for outcome, messages in row["messages"].items()
            for message in messages
        ]
    return "\n".join(lines)
