"""What one side measured at one level: an outcome per request, then the row."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench import report
from bench.ocr_data import score
from bench.ocr_data.pageset import Sample


@dataclass(frozen=True)
class Outcome:
    index: int  # into the page list
    sent_s: float  # perf_counter
    ended_s: float
    prediction: score.Prediction | None  # None: the request failed
    error: str | None = None  # "http 422: ..." or the exception

    @property
    def latency_s(self) -> float:
        return self.ended_s - self.sent_s


def first_per_page(outcomes: Sequence[Outcome]) -> dict[int, score.Prediction]:
    """Each page's first successful prediction: the one its CER counts."""
    found: dict[int, score.Prediction] = {}
    for o in sorted(outcomes, key=lambda o: o.sent_s):
        if o.prediction is not None and o.index not in found:
            found[o.index] = o.prediction
    return found


def summarize(
    side: str, clients: int, outcomes: Sequence[Outcome], samples: Sequence[Sample]
) -> dict[str, Any]:
    """One row: pages/s over the level's wall time, latency p50/p99 (ms), errors and
    the CER of the pages that came back (pages without an answer are listed, not
    scored)."""
    ok = [o for o in outcomes if o.prediction is not None]
    elapsed = (
        (max(o.ended_s for o in outcomes) - min(o.sent_s for o in outcomes)) if outcomes else 0
    )
    latencies = [1e3 * o.latency_s for o in ok]
    predictions = first_per_page(outcomes)
    scored = [score.page_score(samples[i], p) for i, p in sorted(predictions.items())]
    return {
        "side": side,
        "clients": clients,
        "requests": len(outcomes),
        "ok": len(ok),
        "errors": dict(Counter((o.error or "").split(":", 1)[0] for o in outcomes if o.error)),
        "first_errors": [o.error for o in outcomes if o.error][:3],
        "elapsed_s": round(elapsed, 3),
        "pages_per_s": len(ok) / elapsed if elapsed > 0 else 0.0,
        "latency_ms": {
            "p50": report.percentile(latencies, 50),
            "p99": report.percentile(latencies, 99),
        },
        "unanswered_pages": [samples[i].id for i in range(len(samples)) if i not in predictions],
        "cer": score.summary(scored),
        "pages": {  # each page's own figures and what the side read, to see where it erred
            s.sample.id: {
                "cer": round(s.page.cer, 5),
                "line_cer": round(s.lines.cer, 5),
                "text": predictions[i].text,
            }
            for i, s in zip(sorted(predictions), scored, strict=True)
        },
    }
