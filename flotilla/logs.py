"""Keeping the log readable through an outage: the Kafka client logs every failed
connection attempt (ten a second while a broker is down, or a minute of 'not found'
for a missing topic). ``quiet_repeats`` lets the first of a kind through and then one
per window, saying how many it held back, so a failure is a few lines, not a flood."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

CLIENT_LOGGERS = ("aiokafka",)


class RepeatFilter(logging.Filter):
    """Passes a message the first time, then the same message template (whatever its
    arguments) at most once per ``window_s``, noting how many were held back."""

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[tuple[str, object], tuple[float, int]] = {}  # -> (passed at, held)

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = self.clock()
        passed_at, held = self._seen.get(key, (None, 0))
        if passed_at is not None and now - passed_at < self.window_s:
            self._seen[key] = (passed_at, held + 1)
            return False
        if held:
            record.msg = f"{record.msg} [and {held} more like this in {self.window_s:.0f} s]"
        self._seen[key] = (now, 0)
        return True


def quiet_repeats(prefixes: tuple[str, ...] = CLIENT_LOGGERS, window_s: float = 30.0) -> None:
    """Put one ``RepeatFilter`` on every logger under ``prefixes`` that exists now (a
    logger's filters see only its own records, so each module's logger gets it)."""
    shared = RepeatFilter(window_s)
    names = [
        name
        for name in [*prefixes, *logging.root.manager.loggerDict]
        if name in prefixes or name.startswith(tuple(f"{p}." for p in prefixes))
    ]
    for name in dict.fromkeys(names):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RepeatFilter) for f in logger.filters):
            logger.addFilter(shared)
