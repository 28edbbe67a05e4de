"""Progress without a terminal: a plain line every interval with done/total, the rate and
what became of the documents, and the totals at the end; no bar, no escape codes."""

from __future__ import annotations

import asyncio
import io
import re

from flotilla.progress import Progress, Tally


async def test_plain_lines_every_interval_then_the_totals() -> None:
    out = io.StringIO()
    progress = Progress("docs.jsonl -> c", 10, interval_s=0.1, stream=out)
    async with progress:
        assert not progress.on_terminal
        progress.add(done=4, stored=3, failed=1)
        await asyncio.sleep(0.25)
        progress.add(done=6, stored=5, deleted=1)
        await asyncio.sleep(0.15)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3, lines
    assert "\x1b" not in out.getvalue()  # no terminal codes in a log
    first = re.fullmatch(
        r"docs\.jsonl -> c: 4/10 \(40%\) docs in 0 s, \d+ docs/s; 3 stored, 0 deleted, 1 failed",
        lines[0],
    )
    assert first, lines[0]
    assert lines[-1].startswith("docs.jsonl -> c: 10/10 (100%) docs"), lines[-1]
    assert lines[-1].endswith("; 8 stored, 1 deleted, 1 failed")
    assert re.fullmatch(
        r"docs\.jsonl -> c: 10 docs in 0\.\d s \(\d+ docs/s\): 8 stored, 1 deleted, 1 failed",
        progress.summary(),
    ), progress.summary()


async def test_a_stalled_run_reads_as_stalled() -> None:
    """The rate of each line is over its own interval, not the whole run."""
    out = io.StringIO()
    progress = Progress("t -> c", None, interval_s=0.1, unit="records", stream=out)
    async with progress:
        progress.set(Tally(done=50, stored=50))
        await asyncio.sleep(0.35)
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"t -> c: 50 records in 0 s, [1-9]\d* records/s; .*", lines[0]), lines
    assert lines[-1].startswith("t -> c: 50 records in 0 s, 0 records/s"), lines
