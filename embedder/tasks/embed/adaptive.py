"""Adaptive batching: a model's batch wait and batch budget steered toward a p50 latency
target.

The wait (``BatchLimits.max_wait_s``: how long a partial batch waits for company)
buys company with latency. ``WaitController`` sets it from what the worker sees,
with no clock of its own (times are passed in), so it is tested exhaustively.

The law, one step per delivered batch, in seconds (wait and error alike):

    e     = target - p50            gated by what the wait can change (below)
    I    <- clamp(I + ki * e, 0, max_wait)   skipped while the output is clamped and
                                             e pushes it further (anti-windup)
    wait  = clamp(kp * e + I, 0, max_wait)

``p50`` is the median of the last ``window`` delivered jobs' latencies (enqueued
to delivered, as the worker sees it). The raw error means different things in
different regimes, so it is gated by the last ``batches`` formed batches:

- Over target (e < 0), scaled by the share of batches the wait bounded (not
  full): a full batch is flushed at once and never waited, so its latency is
  queueing that no shorter wait removes. At saturation the wait thus stays
  where it is instead of collapsing to 0, and batches stay whole (flush-on-full
  in ``batching.flush_delay`` still forms them the moment they fill). When all
  the clients fit one batch, the wait does go to 0 over target, which costs
  nothing there: the next batch is whatever came back while the device ran.
- Under target (e > 0), headroom is spent on waiting only as far as waiting
  gathers company: scaled by the share of batches with more than one request,
  while the lonely share pulls the wait down at ``lonely`` x target. One
  client alone pays the whole wait on every request and gains nothing, so its
  wait goes to 0 and its p50 to single-request time, whatever the target. A
  few clients that always arrive together do gain company, so their wait
  grows until p50 meets the target or the wait meets max_wait: a target is a
  budget the controller spends.
- Idle: ``idle(now)`` (the worker calls it while nothing is pending, formed or
  running) after ``idle_after_s`` without a delivery decays the wait toward 0
  (time constant ``idle_after_s``) and forgets the old window, so the first
  request after a lull runs at once and stale latencies from an old burst do
  not steer the next one.

The budget: the worker takes, per batch, what its device can run in a share of the
target at its measured pace (``batching.take_budget``); ``budget_factor`` in
[``min_budget_factor``, 1] scales that bound for what the pace does not see (host
work, delivery). Only full batches move it, the way the wait is moved only by the
batches it bounded: after each delivery

    budget_factor <- clamp(budget_factor * exp(kb * full * (target - p50) / target))

with the relative error clamped to [-1, 1] and ``full`` the share of the last
``batches`` that the budget bounded. With no full batch the budget bounded nothing
and the factor is left alone. At saturation p50 is mostly queueing, which a smaller
budget does not remove, so the factor's floor and the budget's own
(``batching.MIN_EFFICIENCY``) bound what steering may cost in throughput; a lull
relaxes the factor back toward 1 as it relaxes the wait toward 0.

Gains (``Gains``): the wait is in seconds and at low load p50 moves by at most
the change of the wait (the median job waits some share of it), so the
integral's loop gain per step is at most ``ki``. The median lags the wait by
up to half the window (some batches), and an integrator with a lag of d steps
is stable below a gain of about 1/d: ``ki = 0.05`` and ``kp = 0.1`` stay well
inside that, reaching a new setting in tens of batches (well under a second
under load) without oscillating. ``lonely = 0.5`` takes a lone client's wait
from ``max_wait`` to 0 in a few steps at the targets fleets use (the P term
alone pulls 5% of the target per step).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from embedder.tasks.embed.batching import BatchLimits, BatchPlan, group_key


@dataclass(frozen=True, slots=True)
class Gains:
    kp: float = 0.1  # proportional: wait seconds per second of error
    ki: float = 0.05  # integral: wait seconds per second of error, per step
    lonely: float = 0.5  # pull per step, as a share of the target, when waiting gains nobody
    # Log of the budget factor per step, per unit of relative error (full batches only):
    # 0.05 halves the budget in about 14 batches at twice the target.
    kb: float = 0.05


def flushed_full(plan: BatchPlan, limits: Mapping[str, BatchLimits]) -> bool:
    """Whether the budget, not the wait, bounded this batch: it reached a limit, or jobs
    of its group were left over for later."""
    first = plan.batch[0]
    limit = limits[first.model]
    if len(plan.batch) >= limit.max_requests or plan.tokens >= limit.max_tokens:
        return True
    key = group_key(first, limits)
    return any(group_key(job, limits) == key for job in plan.remaining)


class WaitController:
    """Steers one model's batch wait within [0, max_wait_s], and the share of its pace's
    budget it takes (``budget_factor``), toward ``target_s`` at p50."""

    def __init__(
        self,
        target_s: float,
        max_wait_s: float,
        *,
        gains: Gains = Gains(),
        window: int = 32,
        batches: int = 16,
        idle_after_s: float = 1.0,
        initial_s: float = 0.0,
        min_budget_factor: float = 0.5,
    ) -> None:
        if not target_s > 0:
            raise ValueError(f"the latency target must be positive, not {target_s}")
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait must not be negative, not {max_wait_s}")
        if window < 1 or batches < 1:
            raise ValueError("the latency window and the batch history need at least one entry")
        if not idle_after_s > 0:
            raise ValueError(f"idle_after_s must be positive, not {idle_after_s}")
        if not 0 < min_budget_factor <= 1:
            raise ValueError(f"min_budget_factor must be in (0, 1], not {min_budget_factor}")
        self.target_s = target_s
        self.max_wait_s = max_wait_s
        self.gains = gains
        self.idle_after_s = idle_after_s
        self._latencies: deque[float] = deque(maxlen=window)
        self._formed: deque[tuple[bool, bool]] = deque(maxlen=batches)  # (company, full)
        self._integral = self._clamp(initial_s)
        self.wait_s = self._integral
        self.min_budget_factor = min_budget_factor
        self.budget_factor = 1.0  # of the budget the pace allows (batching.take_budget)
        self._last_delivery: float | None = None
        self._relaxed_until = -math.inf  # idle decay applied up to here

    def _clamp(self, value: float) -> float:
        return min(max(value, 0.0), self.max_wait_s)

    @property
    def p50_s(self) -> float | None:
        return statistics.median(self._latencies) if self._latencies else None

    def formed(self, requests: int, full: bool) -> None:
        """A batch of ``requests`` jobs was formed; ``full``: its budget bounded it."""
        self._formed.append((requests > 1, full))

    def error_s(self) -> float:
        """The gated error (seconds; positive: room to wait longer), 0 without data."""
        p50 = self.p50_s
        if p50 is None or not self._formed:
            return 0.0
        raw = self.target_s - p50
        n = len(self._formed)
        if raw < 0:
            waited = sum(1 for _, full in self._formed if not full) / n
            return raw * waited
        company = sum(1 for gained, _ in self._formed if gained) / n
        return raw * company - (1.0 - company) * self.gains.lonely * self.target_s

    def delivered(self, latencies: Iterable[float], now: float) -> float:
        """One step after a delivered batch (its jobs' latencies, seconds); the new wait."""
        self._latencies.extend(latencies)
        self._last_delivery = now
        e = self.error_s()
        unclamped = self.gains.kp * e + self._integral
        # Anti-windup: no integration while the output is pinned and e pushes it further,
        # so after a long clamp the first error of the other sign moves the wait at once.
        pinned = (unclamped <= 0.0 and e < 0) or (unclamped >= self.max_wait_s and e > 0)
        if not pinned:
            self._integral = self._clamp(self._integral + self.gains.ki * e)
        self.wait_s = self._clamp(self.gains.kp * e + self._integral)
        self._steer_budget()
        return self.wait_s

    def _steer_budget(self) -> None:
        p50 = self.p50_s
        if p50 is None or not self._formed:
            return
        full = sum(1 for _, bounded in self._formed if bounded) / len(self._formed)
        relative = min(1.0, max(-1.0, (self.target_s - p50) / self.target_s))
        factor = self.budget_factor * math.exp(self.gains.kb * full * relative)
        self.budget_factor = min(1.0, max(self.min_budget_factor, factor))

    def idle(self, now: float) -> float:
        """Called while nothing is delivered: past ``idle_after_s`` since the last delivery,
        the wait decays toward 0 (the budget factor toward 1) and the stale history is
        dropped; the wait."""
        if self._last_delivery is None:
            return self.wait_s
        quiet_from = max(self._last_delivery + self.idle_after_s, self._relaxed_until)
        if now <= quiet_from:
            return self.wait_s
        if self._relaxed_until < self._last_delivery:  # this lull's first decay
            self._latencies.clear()
            self._formed.clear()
            # The error goes with its history, so the P term folds into the integral:
            # the decay starts from the wait in effect, without a jump.
            self._integral = self.wait_s
        decay = math.exp(-(now - quiet_from) / self.idle_after_s)
        self._integral *= decay
        self.budget_factor = 1.0 - (1.0 - self.budget_factor) * decay
        self._relaxed_until = now
        self.wait_s = self._clamp(self._integral)
        return self.wait_s
