"""The background tune (``--untuned background``): the ``QUICK`` search for one model, run
in a child process at a low CPU priority (``--tune-nice``) while the model serves on its
safe profile, bounded in time.

A child process, not a thread of the server: torch's thread count is process-wide and
each candidate loads with its own, so a tune inside the server would change the threads
of the runtime serving requests; torch's intra-op pool would be shared with serving; and
only a whole process can be niced for certain, the thread pools its libraries start
included (a thread inherits its creator's nice value, so nicing the child before it
imports torch covers them all). The child times candidates with the threads serving
uses, so its figures are those of the profile it may choose; under load it runs slower,
but its rounds interleave the candidates, so all slow alike.

Past ``budget_s`` the child stops at the next step and what it has measured decides: the
fastest candidate that passed the guard in the stages it finished, or nothing changes
when none did; the log says which. The child logs each step (stage, step n/m,
candidate); the server relays those lines into its own log.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from embedder.core.fleet import DeviceKind, ModelSpec
from embedder.core.jobs import Task
from embedder.tasks.embed.spec import EmbedSpec, EncoderSpec
from embedder.tuned import Measured, TunedEntry
from embedder.tuning.search import REFERENCE, Loader, Trial

log = logging.getLogger(__name__)

# (fleet spec, device, threads, budget_s) -> the tuned entry, or None: nothing changes.
Tuner = Callable[[ModelSpec, DeviceKind, int, float], Awaitable[TunedEntry | None]]
RESULT = "flotilla-tuned: "  # the child's result line on stdout, among whatever else
# Past the budget, what the child may still take to finish the step it is in (a
# candidate's load or export) before it is killed.
GRACE_S = 120.0
LOWEST = 19  # nice value: only what serving leaves idle
_T = TypeVar("_T")


class BudgetSpent(Exception):
    """The tune's time is up: the search stops where it is."""


class LoggedProgress:
    """The search's progress as log lines, and its clock: past the deadline the next
    step raises ``BudgetSpent``."""

    def __init__(
        self, model: str, budget_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.model, self.clock = model, clock
        self.deadline = clock() + budget_s
        self.name, self.steps, self.step = "", 0, 0

    def stage(self, name: str, steps: int) -> None:
        self.name, self.steps, self.step = name, steps, 0
        log.info("tuning %s: %s, %d steps", self.model, name, steps)

    def advance(self, label: str) -> None:
        self.step += 1
        log.info(
            "tuning %s: %s, step %d/%d: %s", self.model, self.name, self.step, self.steps, label
        )
        if self.clock() > self.deadline:
            raise BudgetSpent(f"{self.name}, step {self.step}/{self.steps}")


def entry_of(chosen: Trial, fp32: Trial | None, runner_up: Trial | None, note: str) -> TunedEntry:
    verdict = chosen.verdict
    return TunedEntry(
        profile=chosen.candidate.fields(),
        measured=Measured(
            tokens_per_s=round(chosen.tokens_per_s or 0.0, 1),
            worst_cosine=round(verdict.worst_cosine if verdict else 0.0, 6),
            fp32_tokens_per_s=round(fp32.tokens_per_s or 0.0, 1) if fp32 else None,
            runner_up={
                **runner_up.candidate.fields(),
                "tokens_per_s": round(runner_up.tokens_per_s or 0.0, 1),
            }
            if runner_up is not None
            else None,
            calibration=note,
            date=dt.date.today().isoformat(),
            command="background tune",
        ),
    )


def tune_here(
    spec: EncoderSpec,
    device: DeviceKind,
    threads: int,
    budget_s: float,
    loader: Loader,
    clock: Callable[[], float] = time.monotonic,
) -> TunedEntry | None:
    """The quick search for this kind of device within ``budget_s``; None when nothing
    passed in time. Unwatched (no quiet checks): beside the server it tunes for, the
    server's own work is the load a background tune is meant to yield to."""
    from embedder.tuning.quick import CALIBRATION, quick_search
    from embedder.tuning.search import TuneError

    search = quick_search(spec, device, loader, threads, LoggedProgress(spec.name, budget_s, clock))
    try:
        outcome = search.run()
    except BudgetSpent as spent:
        return _so_far(spec.name, search.trials, budget_s, str(spent), CALIBRATION)
    except TuneError as exc:
        log.warning("tuning %s: %s; nothing changes", spec.name, exc)
        return None
    return entry_of(outcome.chosen, outcome.reference, outcome.runner_up, CALIBRATION)


def _so_far(
    model: str, trials: list[Trial], budget_s: float, where: str, note: str
) -> TunedEntry | None:
    passed = [t for t in trials if t.passed]
    if not passed:
        log.warning(
            "tuning %s: the budget of %.0f s ran out at %s, before any candidate passed: "
            "nothing changes (raise --tune-budget-s)",
            model, budget_s, where,
        )  # fmt: skip
        return None
    best = max(passed, key=lambda t: t.tokens_per_s or 0.0)
    log.warning(
        "tuning %s: the budget of %.0f s ran out at %s: the best measured so far decides "
        "(%s)",
        model, budget_s, where, best.candidate.label,
    )  # fmt: skip
    fp32 = next((t for t in trials if (t.candidate.runtime, t.candidate.dtype) == REFERENCE), None)
    return entry_of(best, fp32, None, note + f"; cut short by the {budget_s:.0f} s budget")


# -- the child process ------------------------------------------------------------------


def main() -> None:
    """Child: reads {spec, device, threads, budget_s} as JSON on stdin, logs to stderr,
    prints the result line on stdout."""
    asked = json.loads(sys.stdin.read())
    with contextlib.suppress(OSError, AttributeError):  # before torch starts any thread
        os.setpriority(os.PRIO_PROCESS, 0, int(asked.get("nice", LOWEST)))
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    spec = EmbedSpec.model_validate(asked["spec"])
    from embedder.tasks.embed.runtimes import load_runtime

    made = tune_here(spec, asked["device"], asked["threads"], asked["budget_s"], load_runtime)
    found = made.model_dump(mode="json", exclude_none=True) if made is not None else None
    print(RESULT + json.dumps(found), flush=True)


async def tune_in_child(
    spec: ModelSpec, device: DeviceKind, threads: int, budget_s: float, *, nice: int = LOWEST
) -> TunedEntry | None:
    """The background tune of ``spec`` in a child process (``main``) at CPU priority
    ``nice``; its log lines are relayed here. None when it chose nothing, failed or
    overran its budget."""
    if spec.task != Task.EMBED:
        log.info("%s: only embedding models are tuned; it keeps its profile", spec.name)
        return None
    asked = {
        "spec": spec.model_dump(mode="json", by_alias=True),
        "device": device,
        "threads": threads,
        "budget_s": budget_s,
        "nice": nice,
    }
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", __name__,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(budget_s + GRACE_S):
            out = await _talk(child, json.dumps(asked))
    except TimeoutError:
        log.warning(
            "tuning %s: overran its budget by %.0f s: stopped, nothing changes", spec.name, GRACE_S
        )
        return None
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    lines = [line for line in out.splitlines() if line.startswith(RESULT)]
    if child.returncode != 0 or not lines:
        log.warning("tuning %s failed (exit %s): nothing changes", spec.name, child.returncode)
        return None
    found = json.loads(lines[-1][len(RESULT) :])
    return None if found is None else TunedEntry.model_validate(found)


async def _talk(child: asyncio.subprocess.Process, asked: str) -> str:
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    child.stdin.write(asked.encode())
    child.stdin.close()

    async def relay() -> None:
        assert child.stderr is not None
        async for line in child.stderr:
            log.info("%s", line.decode(errors="replace").rstrip())

    relaying = asyncio.create_task(relay())
    out = await child.stdout.read()
    await relaying
    await child.wait()
    return out.decode(errors="replace")


async def in_low_priority_thread(fn: Callable[..., _T], *args: object) -> _T:
    """``fn(*args)`` on a thread of its own at the lowest priority (Linux sets a nice value
    per thread), so loading a model beside a serving one yields the cores to serving. Its
    own thread, which ends after: the priority never leaks into a pooled thread."""

    def lowered() -> _T:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST)
        return fn(*args)

    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flotilla-retune")
    try:
        return await asyncio.get_running_loop().run_in_executor(executor, lowered)
    finally:
        executor.shutdown(wait=False)


if __name__ == "__main__":
    main()
