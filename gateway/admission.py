"""Admission control: a bounded number of estimated tokens in flight per model.

Beyond the bound a request is refused at once with 429 and Retry-After,
instead of queueing without limit: overload turns into fast refusals, never
into hangs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

from embedder.errors import LimitExceeded, Overloaded


class Admission:
    def __init__(self, max_inflight_tokens: int) -> None:
        self.max_inflight_tokens = max_inflight_tokens
        self.inflight: dict[str, int] = {}

    @contextlib.contextmanager
    def admit(self, model: str, tokens: int, drain_tokens_per_s: float) -> Iterator[None]:
        """Hold ``tokens`` of ``model``'s budget for the duration of the block."""
        if tokens > self.max_inflight_tokens:
            raise LimitExceeded(
                f"this request is estimated at {tokens} tokens, more than the "
                f"{self.max_inflight_tokens} a model admits at once: split it, or raise "
                "--max-inflight-tokens (FLOTILLA_MAX_INFLIGHT_TOKENS)"
            )
        current = self.inflight.get(model, 0)
        if current + tokens > self.max_inflight_tokens:
            wait_s = math.ceil(current / drain_tokens_per_s) if drain_tokens_per_s > 0 else 1
            raise Overloaded(
                f"model {model!r} has {current} tokens in flight, at its limit of "
                f"{self.max_inflight_tokens}: retry after the Retry-After seconds",
                retry_after_s=max(1, wait_s),
            )
        self.inflight[model] = current + tokens
        try:
            yield
        finally:
            self.inflight[model] -= tokens


class RateMeter:
    """Tokens per second over a sliding window, to size Retry-After honestly."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._events: dict[str, list[tuple[float, int]]] = {}

    def add(self, model: str, tokens: int, now: float) -> None:
        events = self._events.setdefault(model, [])
        events.append((now, tokens))
        cutoff = now - self.window_s
        while events and events[0][0] < cutoff:
            events.pop(0)

    def rate(self, model: str, now: float) -> float:
        cutoff = now - self.window_s
        return sum(n for t, n in self._events.get(model, ()) if t >= cutoff) / self.window_s
