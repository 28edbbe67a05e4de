"""Admission control: a bounded number of estimated tokens in flight per model.

Beyond the bound a request is refused at once with 429 and Retry-After,
instead of queueing without limit: overload turns into fast refusals, never
into hangs. Retry-After is the time the tokens in flight take to drain at the rate
the model has been serving them (``DrainMeter``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterator

from embedder.core.errors import LimitExceeded, Overloaded

# Retry-After bounds, seconds. Below 1 the header cannot go (whole seconds); above a
# minute a client is better told to come back soon and look again than to wait on a
# guess: the rate may change, the queue is drained long before.
MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60


class DrainMeter:
    """How fast a model's admitted tokens drain: the tokens served since the model last
    became busy (at most ``window_s`` back), over the time since then.

    Counting from when the model became busy, not over a fixed window, is what keeps
    the rate honest at the start of a burst: a model idle for a minute that served
    5,000 tokens in the half second since a burst began drains at 10,000 tokens/s, not at
    the 500 a ten-second window would say (which sent clients away for 75 s from a
    burst that drained in 9). Until the busy period is ``min_span_s`` old the rate of the
    previous one stands in; the first busy period of all has none (``rate`` is None)."""

    def __init__(self, window_s: float = 10.0, min_span_s: float = 0.25) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self._served: dict[str, deque[tuple[float, int]]] = {}
        self._busy_since: dict[str, float] = {}
        self._last_rate: dict[str, float] = {}

    def busy(self, model: str, now: float) -> None:
        """The model had nothing in flight and has work again."""
        self._busy_since[model] = now

    def idle(self, model: str, now: float) -> None:
        """The model's last admitted request finished: keep the rate it drained at."""
        if (rate := self._measured(model, now)) is not None:
            self._last_rate[model] = rate
        self._busy_since.pop(model, None)

    def served(self, model: str, tokens: int, now: float) -> None:
        served = self._served.setdefault(model, deque())
        served.append((now, tokens))
        while served and served[0][0] < now - self.window_s:
            served.popleft()

    def rate(self, model: str, now: float) -> float | None:
        """Tokens per second, or None when nothing has been measured yet."""
        measured = self._measured(model, now)
        return measured if measured is not None else self._last_rate.get(model)

    def _measured(self, model: str, now: float) -> float | None:
        start = max(now - self.window_s, self._busy_since.get(model, now))
        span = now - start
        if span < self.min_span_s:
            return None
        tokens = sum(n for t, n in self._served.get(model, ()) if t >= start)
        return tokens / span if tokens else None


def retry_after_s(queued_tokens: int, rate: float | None) -> int:
    """Seconds until ``queued_tokens`` have drained at ``rate``, within the bounds; the
    lower bound when no rate is known (come back soon and be told better)."""
    if not rate:
        return MIN_RETRY_AFTER_S
    return max(MIN_RETRY_AFTER_S, min(MAX_RETRY_AFTER_S, math.ceil(queued_tokens / rate)))


class Admission:
    def __init__(
        self, max_inflight_tokens: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_inflight_tokens = max_inflight_tokens
        self.inflight: dict[str, int] = {}
        self.clock = clock
        self.drain = DrainMeter()

    @contextlib.contextmanager
    def admit(self, model: str, tokens: int) -> Iterator[None]:
        """Hold ``tokens`` of ``model``'s budget for the duration of the block; a block
        that ends without an exception counts them as served."""
        if tokens > self.max_inflight_tokens:
            raise LimitExceeded(
                f"this request is estimated at {tokens} tokens, more than the "
                f"{self.max_inflight_tokens} a model admits at once: split it, or raise "
                "--max-inflight-tokens (FLOTILLA_MAX_INFLIGHT_TOKENS)"
            )
        current = self.inflight.get(model, 0)
        now = self.clock()
        if current + tokens > self.max_inflight_tokens:
            wait_s = retry_after_s(current, self.drain.rate(model, now))
            raise Overloaded(
                f"model {model!r} has {current} tokens in flight, at its limit of "
                f"{self.max_inflight_tokens}: retry after the Retry-After seconds ({wait_s} s "
                "at the rate it serves)",
                retry_after_s=wait_s,
            )
        if current == 0:
            self.drain.busy(model, now)
        self.inflight[model] = current + tokens
        try:
            yield
        except BaseException:
            self._release(model, tokens)
            raise
        self.drain.served(model, tokens, self.clock())
        self._release(model, tokens)

    def _release(self, model: str, tokens: int) -> None:
        self.inflight[model] -= tokens
        if self.inflight[model] == 0:
            self.drain.idle(model, self.clock())
