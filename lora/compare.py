"""One system against another on the same queries: the difference of a metric's mean,
how sure it is, and where it comes from.

The interval is a paired bootstrap (Efron & Tibshirani; Sakai 2006 for IR): the
queries are resampled with replacement, each resample's mean of the per-query
differences is taken, and the 2.5th and 97.5th percentiles of those means bound the
95% interval. Pairing matters: two systems' scores on a query move together, so the
spread of the differences is far smaller than the spread of either score.

Per-law lifts group the queries by the laws of their relevant passages (a passage id
is ``law/§n``, as ``lora.pairs`` writes it); a heading that is relevant in two laws
("Verjährung") counts for both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lora.metrics import Qrels

PerQuery = Mapping[str, Mapping[str, float]]  # query id -> metric -> score


@dataclass(frozen=True, slots=True)
class Lift:
    queries: int
    baseline: float  # the baseline's mean
    system: float  # the system's mean
    better: int  # queries the system scores higher on
    worse: int

    @property
    def delta(self) -> float:
        return self.system - self.baseline

    @property
    def relative(self) -> float:
        return self.delta / self.baseline if self.baseline else float("nan")


@dataclass(frozen=True, slots=True)
class Comparison:
    baseline: str
    system: str
    metric: str
    overall: Lift
    low: float  # the bootstrap interval of the mean difference
    high: float
    confidence: float
    resamples: int
    per_law: dict[str, Lift]

    def as_dict(self) -> dict[str, Any]:
        def lift(x: Lift) -> dict[str, Any]:
            return asdict(x) | {"delta": x.delta, "relative": x.relative}

        return {
            "baseline": self.baseline,
            "system": self.system,
            "metric": self.metric,
            "overall": lift(self.overall),
            "interval": [self.low, self.high],
            "confidence": self.confidence,
            "resamples": self.resamples,
            "per_law": {law: lift(x) for law, x in self.per_law.items()},
        }


def paired_bootstrap(
    baseline: Sequence[float],
    system: Sequence[float],
    *,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """The ``confidence`` interval of mean(system - baseline) over resampled queries."""
    diffs = np.asarray(system, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if diffs.size == 0:
        raise ValueError("no queries to compare")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    step = max(1, 4_000_000 // diffs.size)  # resamples per block: bounded memory
    for start in range(0, resamples, step):
        n = min(step, resamples - start)
        means[start : start + n] = diffs[rng.integers(0, diffs.size, (n, diffs.size))].mean(1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def _lift(baseline: Sequence[float], system: Sequence[float]) -> Lift:
    a, b = np.asarray(baseline), np.asarray(system)
    return Lift(
        queries=len(a),
        baseline=float(a.mean()) if len(a) else 0.0,
        system=float(b.mean()) if len(b) else 0.0,
        better=int((b > a).sum()),
        worse=int((b < a).sum()),
    )


def laws_of(judged: Mapping[str, int]) -> set[str]:
    return {doc.split("/", 1)[0] for doc, grade in judged.items() if grade > 0 and "/" in doc}


def compare(
    baseline: tuple[str, PerQuery],
    system: tuple[str, PerQuery],
    qrels: Qrels,
    *,
    metric: str = "ndcg@10",
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Comparison:
    """``system`` against ``baseline`` (name, per-query scores) on the queries both scored."""
    (base_name, base_scores), (name, scores) = baseline, system
    qids = sorted(set(base_scores) & set(scores))
    a = [base_scores[q][metric] for q in qids]
    b = [scores[q][metric] for q in qids]
    low, high = paired_bootstrap(a, b, resamples=resamples, confidence=confidence, seed=seed)
    groups: dict[str, list[int]] = {}
    for i, qid in enumerate(qids):
        for law in laws_of(qrels.get(qid, {})):
            groups.setdefault(law, []).append(i)
    per_law = {
        law: _lift([a[i] for i in rows], [b[i] for i in rows])
        for law, rows in sorted(groups.items())
    }
    return Comparison(
        base_name, name, metric, _lift(a, b), low, high, confidence, resamples, per_law
    )


def describe(c: Comparison) -> str:
    """A paragraph: the overall lift with its interval, then one line per law."""
    o = c.overall
    lines = [
        f"{c.system} against {c.baseline}, {c.metric}: {o.baseline:.4f} -> {o.system:.4f}, "
        f"{o.delta:+.4f} ({o.relative:+.1%} relative; {c.confidence:.0%} paired bootstrap "
        f"interval {c.low:+.4f} to {c.high:+.4f}); {o.queries} queries, {o.better} better, "
        f"{o.worse} worse"
    ]
    width = max((len(law) for law in c.per_law), default=0)
    for law, x in c.per_law.items():
        lines.append(
            f"  {law:<{width}}  {x.queries:>5} queries  {x.baseline:.4f} -> {x.system:.4f}  "
            f"{x.relative:+7.1%}  ({x.better} better, {x.worse} worse)"
        )
    return "\n".join(lines)
