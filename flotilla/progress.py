"""The progress of a long command, truthful wherever its output goes.

On a terminal, a bar: done of total, rate, time left, and what became of the documents.
Anywhere else (a log file, CI, a pipe), where a bar shows nothing until it ends, a plain
line every ``interval_s`` seconds with the same facts, the rate over the last interval,
so a stalled run reads as stalled. The command ends with its totals on one line
(``summary``), counted from what the store and the server confirmed, not from what was
read.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as Bar
from rich.text import Text


@dataclass(slots=True)
class Tally:
    """What became of the records of a run so far."""

    done: int = 0  # records handled: stored, deleted, failed, or replaced in their batch
    stored: int = 0
    deleted: int = 0
    failed: int = 0


class _Rate(ProgressColumn):
    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        return Text(f"{task.speed or 0:,.0f} {self.unit}/s")


class Progress:
    """``async with Progress(...) as progress: progress.add(done=..., stored=...)``.

    ``outcomes`` shows stored, deleted and failed beside the count (off for a run that
    only sends or only reads); ``note`` adds a live fact to each update (Kafka's lag)."""

    def __init__(
        self,
        description: str,
        total: int | None = None,
        *,
        interval_s: float = 5.0,
        unit: str = "docs",
        outcomes: bool = True,
        note: Callable[[], str] | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.description = description
        self.total = total
        self.interval_s = interval_s
        self.unit = unit
        self.outcomes = outcomes
        self.note = note
        self.stream = stream or sys.stdout
        self.tally = Tally()
        self._console = Console(file=self.stream)
        self._bar: Bar | None = None
        self._task_id: object = None
        self._ticker: asyncio.Task[None] | None = None
        self._started = time.monotonic()

    @property
    def on_terminal(self) -> bool:
        return self._console.is_terminal

    async def __aenter__(self) -> Self:
        self._started = time.monotonic()
        if self.on_terminal:
            columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
            columns += [_Rate(self.unit), TimeElapsedColumn(), TimeRemainingColumn()]
            self._bar = Bar(*columns, TextColumn("{task.fields[facts]}"), console=self._console)
            self._bar.start()
            self._task_id = self._bar.add_task(self.description, total=self.total, facts="")
        else:
            self._ticker = asyncio.create_task(self._tick(), name="progress-lines")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._bar is not None:
            self._refresh()
            self._bar.stop()

    def add(self, *, done: int = 0, stored: int = 0, deleted: int = 0, failed: int = 0) -> None:
        tally = self.tally
        tally.done += done
        tally.stored += stored
        tally.deleted += deleted
        tally.failed += failed
        self._refresh()

    def advance(self, done: int) -> None:
        """``done`` more records, of a run that counts no outcomes."""
        self.add(done=done)

    def set(self, tally: Tally) -> None:
        """Totals kept elsewhere (a Kafka source's), as they stand now."""
        self.tally = Tally(tally.done, tally.stored, tally.deleted, tally.failed)
        self._refresh()

    def _refresh(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task_id, completed=self.tally.done, facts=self._facts())  # type: ignore[arg-type]

    def _facts(self) -> str:
        tally = self.tally
        parts = [f"{tally.stored} stored, {tally.deleted} deleted, {tally.failed} failed"]
        if not self.outcomes:
            parts = []
        if self.note is not None and (note := self.note()):
            parts.append(note)
        return ", ".join(parts)

    async def _tick(self) -> None:
        last_done, last_at = 0, time.monotonic()
        while True:
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            rate = (self.tally.done - last_done) / max(now - last_at, 1e-9)
            last_done, last_at = self.tally.done, now
            print(self.line(rate), file=self.stream, flush=True)

    def line(self, rate: float) -> str:
        """One plain progress line, with ``rate`` the recent records per second."""
        done = f"{self.tally.done}"
        if self.total:
            done += f"/{self.total} ({100 * self.tally.done / self.total:.0f}%)"
        elapsed = time.monotonic() - self._started
        facts = self._facts()
        return (
            f"{self.description}: {done} {self.unit} in {elapsed:.0f} s, "
            f"{rate:,.0f} {self.unit}/s" + (f"; {facts}" if facts else "")
        )

    def summary(self) -> str:
        """The run's totals on one line, for its end."""
        elapsed = time.monotonic() - self._started
        rate = self.tally.done / max(elapsed, 1e-9)
        facts = self._facts()
        return (
            f"{self.description}: {self.tally.done} {self.unit} in {elapsed:.1f} s "
            f"({rate:,.0f} {self.unit}/s)" + (f": {facts}" if facts else "")
        )
