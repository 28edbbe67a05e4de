"""Pure parts of the peer comparison: the accuracy gate, the loads, the ratios.

A peer's number counts only once its vectors match SentenceTransformer's fp32
vectors on the same texts (worst cosine at least ``MIN_COSINE``): a server
that truncates or pools differently would otherwise look fast for the wrong
reason. Ratios are flotilla's tokens/s over the peer's, per load, from the
two measured back to back in the same run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from embedder.tasks.embed import runtimes

MIN_COSINE = runtimes.MIN_COSINE  # the guard every reduced precision of flotilla's passes


@dataclass(frozen=True)
class Load:
    """``clients`` closed-loop clients, each request ``inputs`` texts."""

    clients: int
    inputs: int

    @property
    def name(self) -> str:
        return f"{self.clients}x{self.inputs}"

    def __str__(self) -> str:
        return self.name


DEFAULT_LOADS = (Load(16, 8), Load(64, 1))


def parse_loads(value: str) -> list[Load]:
    """'16x8,64x1' -> [Load(16, 8), Load(64, 1)]."""
    loads: list[Load] = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        clients, sep, inputs = part.partition("x")
        if not sep or not clients.isdigit() or not inputs.isdigit():
            raise ValueError(f"a load is CLIENTSxTEXTS, e.g. 16x8; got {part!r}")
        load = Load(int(clients), int(inputs))
        if not (1 <= load.clients <= 1024 and 1 <= load.inputs <= 256):
            raise ValueError(f"{part!r}: clients in 1..1024, texts in 1..256")
        loads.append(load)
    if not loads:
        raise ValueError("no loads given")
    return loads


def worst_cosine(got: NDArray[np.float32], expected: NDArray[np.float32]) -> float:
    """Worst per-row cosine of two (n, dim) arrays; -1 when the shapes differ."""
    if got.shape != expected.shape or got.ndim != 2 or len(got) == 0:
        return -1.0
    return runtimes.worst_cosine(expected, got)


def accuracy_gate(worst: float, min_cosine: float = MIN_COSINE) -> str | None:
    """None when the vectors pass, else why the peer's numbers do not count."""
    if math.isnan(worst) or worst < min_cosine:
        return (
            f"vectors differ from SentenceTransformer fp32: worst cosine {worst:.5f} "
            f"< {min_cosine}; its numbers do not count"
        )
    return None


@dataclass(frozen=True)
class Measured:
    """One side at one load: tokens/s and latency percentiles in ms."""

    tokens_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int = 0


def ratio(flotilla: Measured, peer: Measured) -> float:
    """flotilla's tokens/s over the peer's; nan when either served nothing."""
    if flotilla.tokens_per_s <= 0 or peer.tokens_per_s <= 0:
        return float("nan")
    return flotilla.tokens_per_s / peer.tokens_per_s


def geomean(values: Sequence[float]) -> float:
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    if not finite or len(finite) != len(values):
        return float("nan")
    return math.exp(sum(math.log(v) for v in finite) / len(finite))


def best_config(results: dict[str, dict[str, Measured]]) -> str | None:
    """The peer configuration with the highest geometric-mean tokens/s over the loads;
    one with an error-free load missing, or errors, does not qualify."""
    scored: dict[str, float] = {}
    for config, per_load in results.items():
        if not per_load or any(m.errors for m in per_load.values()):
            continue
        scored[config] = geomean([m.tokens_per_s for m in per_load.values()])
    scored = {k: v for k, v in scored.items() if math.isfinite(v)}
    return max(scored, key=lambda k: scored[k]) if scored else None


def comparison_rows(
    flotilla: dict[str, Measured], peer: dict[str, Measured], loads: Sequence[Load]
) -> list[dict[str, Any]]:
    """One row per load: both sides' figures and flotilla/peer."""
    rows: list[dict[str, Any]] = []
    for load in loads:
        ours, theirs = flotilla.get(load.name), peer.get(load.name)
        if ours is None or theirs is None:
            continue
        rows.append(
            {
                "load": load.name,
                "clients": load.clients,
                "texts_per_request": load.inputs,
                "flotilla_tokens_per_s": ours.tokens_per_s,
                "flotilla_p50_ms": ours.p50_ms,
                "flotilla_p99_ms": ours.p99_ms,
                "flotilla_errors": ours.errors,
                "peer_tokens_per_s": theirs.tokens_per_s,
                "peer_p50_ms": theirs.p50_ms,
                "peer_p99_ms": theirs.p99_ms,
                "peer_errors": theirs.errors,
                "ratio_flotilla_over_peer": ratio(ours, theirs),
            }
        )
    return rows
