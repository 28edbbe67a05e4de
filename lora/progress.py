"""Plain progress lines for a training run whose output is not a terminal.

A progress bar draws only on a terminal: in a log file, CI or a pipe a run of many
minutes shows nothing until it ends. There, one line every ``interval_s`` seconds says
where it is (step of total), how it goes (the last loss) and how long it has taken and
will take (the ETA from this run's own pace: steps a resumed run did before it started
do not make it look faster than it is).

The clock is passed in, so the lines are a function of the steps and the times.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class StepLines:
    """``update(step, loss)`` after each step prints a line when ``interval_s`` has
    passed since the last one; ``close`` prints the last state once."""

    def __init__(
        self,
        description: str,
        total: int,
        *,
        interval_s: float = 5.0,
        start_step: int = 0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.description = description
        self.total = total
        self.interval_s = interval_s
        self.start_step = start_step
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.started = clock()
        self._last_line = self.started
        self._step = start_step
        self._loss: float | None = None
        self._printed_step = -1

    def update(self, step: int, loss: float | None = None) -> None:
        self._step = step
        if loss is not None:
            self._loss = loss
        now = self.clock()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            self._print()

    def close(self) -> None:
        if self._printed_step != self._step:
            self._print()

    def _print(self) -> None:
        self._printed_step = self._step
        print(self.line(), file=self.stream, flush=True)

    def line(self) -> str:
        elapsed = self.clock() - self.started
        step, total = self._step, self.total
        done_here = step - self.start_step
        if done_here > 0 and total > step:
            eta = _duration(elapsed / done_here * (total - step))
        else:
            eta = "0:00" if step >= total else "?"
        loss = "-" if self._loss is None else f"{self._loss:.4f}"
        percent = 100 * step / total if total else 100.0
        return (
            f"{self.description}: step {step}/{total} ({percent:.0f}%), loss {loss}, "
            f"elapsed {_duration(elapsed)}, ETA {eta}"
        )
