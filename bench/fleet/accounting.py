"""What the load's answers add up to, per model: requests, answers by status, wrong
vectors, p50/p99 of the correct answers; and which answers fail the run. Pure: answers
in, rows out.

The allowed failure is the documented one: 503 with Retry-After, the answer a request
gets when its model cannot be made resident within its deadline (its last load took
longer than the time left, or the budget is held by models in use). Anything else (a
5xx, a 504 past the deadline, a 503 without Retry-After, a dropped connection, a 200 with
other vectors) fails the run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench import report

OK = "200"
WRONG = "wrong"  # a 200 whose vectors are not the model's
REFUSED = "503"


@dataclass(frozen=True, slots=True)
class Answer:
    model: str
    at_s: float  # when it was due to be sent, since the load began (latency counts from it)
    done_s: float
    outcome: str  # the HTTP status, WRONG, or the client's exception
    detail: str = ""  # what an error answer said
    retry_after: str | None = None
    cosine: float | None = None  # a 200's worst cosine to the references

    @property
    def latency_ms(self) -> float:
        return (self.done_s - self.at_s) * 1e3

    @property
    def allowed(self) -> bool:
        """Correct, or refused as documented."""
        return self.outcome == OK or (self.outcome == REFUSED and self.retry_after is not None)


def by_model(answers: Iterable[Answer]) -> dict[str, list[Answer]]:
    out: dict[str, list[Answer]] = {}
    for a in answers:
        out.setdefault(a.model, []).append(a)
    return out


def model_row(model: str, answers: Sequence[Answer]) -> dict[str, Any]:
    ok_ms = [a.latency_ms for a in answers if a.outcome == OK]
    cosines = [a.cosine for a in answers if a.cosine is not None]
    return {
        "model": model,
        **totals(answers),
        "max_ms": max(ok_ms) if ok_ms else float("nan"),
        "worst_cosine": min(cosines) if cosines else None,
    }


def rows(models: Sequence[str], answers: Iterable[Answer]) -> list[dict[str, Any]]:
    """One row per model of the fleet, in its order, asked or not."""
    grouped = by_model(answers)
    return [model_row(m, grouped.get(m, [])) for m in models]


def failures(answers: Iterable[Answer], most: int = 5) -> dict[str, list[str]]:
    """The answers that fail the run, by outcome: their most frequent messages."""
    found: dict[str, Counter[str]] = {}
    for a in answers:
        if not a.allowed:
            found.setdefault(a.outcome, Counter())[f"{a.model}: {a.detail}"] += 1
    return {
        outcome: [f"{n}x {text}" for text, n in counts.most_common(most)]
        for outcome, counts in found.items()
    }


def totals(answers: Sequence[Answer]) -> dict[str, Any]:
    ok_ms = [a.latency_ms for a in answers if a.outcome == OK]
    return {
        "requests": len(answers),
        "answers": dict(Counter(a.outcome for a in answers).most_common()),
        "correct": len(ok_ms),
        "refused": sum(a.outcome == REFUSED and a.retry_after is not None for a in answers),
        "errors": sum(not a.allowed for a in answers),
        "p50_ms": report.percentile(ok_ms, 50),
        "p99_ms": report.percentile(ok_ms, 99),
    }
