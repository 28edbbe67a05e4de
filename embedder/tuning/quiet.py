"""A quiet device for timing: how many cores other processes keep busy, and rounds
timed only while that stays low.

The load of *others* is the CPU time the whole machine spent busy (``/proc/stat``) less
this process's own (all its threads), over the wall time between two samples: a
tuner's own threads never count against it, a build or a benchmark beside it does.
Torch-free; on a platform without ``/proc/stat`` the load is unknown (None) and timing
goes on unchecked, saying so.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
PROC_STAT = Path("/proc/stat")

# A quarter core: an idle machine's daemons stay far below it (hundredths), one busy
# process beside the tuner (a build, a benchmark) is a whole core above it.
THRESHOLD_CORES = 0.25
# How long a round waits for the load to fall, polling: long enough for a burst (a
# compile, a cron job) to pass, short enough that a busy machine is reported in minutes.
WAIT_S = 30.0
POLL_S = 0.5
# A round disturbed during its timing is timed again, at most this many more times.
EXTRA_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class CpuSample:
    wall_s: float  # monotonic
    busy_s: float  # every core's busy time, since boot
    own_s: float  # this process's CPU time, all threads


def other_cores(before: CpuSample, after: CpuSample) -> float:
    """Cores kept busy by other processes between two samples (never below 0: the two
    clocks tick at different grains)."""
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        return 0.0
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return max(0.0, others / wall)


def proc_sample() -> CpuSample | None:
    """Now, from /proc/stat and this process's CPU clock; None where there is no /proc."""
    try:
        first = PROC_STAT.read_text(encoding="ascii").split("\n", 1)[0].split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy.
    # Steal counts too: a hypervisor that runs a neighbour instead of us slows timings.
    ticks = [int(v) for v in first[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return CpuSample(time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), time.process_time())


class LoadMeter(Protocol):
    """Starts an interval; the callable it returns ends it with the other cores seen
    (None: unknown here)."""

    def __call__(self) -> Callable[[], float | None]: ...


def proc_meter() -> Callable[[], float | None]:
    start = proc_sample()
    if start is None:
        return lambda: None

    def stop() -> float | None:
        end = proc_sample()
        return None if end is None else other_cores(start, end)

    return stop


@dataclass(slots=True)
class LoadSeen:
    """What the quiet checks saw over a search: the busiest other load during a round
    whose figures were kept, the rounds timed again, the seconds waited, and whether timing stayed
    disturbed after every repeat (then the figures are not this device's own)."""

    known: bool = False
    max_other_cores: float | None = None
    disturbed_rounds: int = 0
    waited_s: float = 0.0
    noisy: bool = False
    threshold_cores: float = THRESHOLD_CORES

    def saw(self, load: float | None) -> None:
        if load is None:
            return
        self.known = True
        self.max_other_cores = max(load, self.max_other_cores or 0.0)


class Quieting(Protocol):
    """What the search asks of the device before and during its timed rounds."""

    seen: LoadSeen

    def round(
        self, body: Callable[[], T], on_wait: Callable[[float], None]
    ) -> tuple[T, float | None]:
        """``body``'s result from the round kept, and the other load during it."""
        ...


class Unwatched:
    """No checks: rounds run as they come, the load unknown (a load-time tune)."""

    def __init__(self) -> None:
        self.seen = LoadSeen()

    def round(
        self, body: Callable[[], T], on_wait: Callable[[float], None]
    ) -> tuple[T, float | None]:
        return body(), None


class Quiet:
    """Rounds on a quiet CPU: before each, wait (polling, at most ``wait_s``) for the
    other load to fall to ``threshold_cores``; time it while measuring that load, and
    time it again (at most ``extra_attempts`` times) when it rose above. Once a round
    stays disturbed the search is noisy and later rounds neither wait nor repeat: the
    result will be refused anyway, and a busy machine should hear so in minutes."""

    def __init__(
        self,
        meter: LoadMeter = proc_meter,
        *,
        threshold_cores: float = THRESHOLD_CORES,
        wait_s: float = WAIT_S,
        poll_s: float = POLL_S,
        extra_attempts: int = EXTRA_ATTEMPTS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.meter, self.sleep = meter, sleep
        self.threshold, self.wait_s, self.poll_s = threshold_cores, wait_s, poll_s
        self.extra_attempts = extra_attempts
        self.seen = LoadSeen(threshold_cores=threshold_cores)

    def _poll(self) -> float | None:
        stop = self.meter()
        self.sleep(self.poll_s)
        return stop()

    def settle(self, on_wait: Callable[[float], None]) -> float | None:
        """Wait until the other load is at most the threshold, or ``wait_s`` passed; the
        last load seen (None: unknown)."""
        load = self._poll()
        waited, told = 0.0, False
        while load is not None and load > self.threshold and waited < self.wait_s:
            if not told:
                on_wait(load)
                told = True
            load = self._poll()
            waited += self.poll_s
        self.seen.waited_s += waited
        return load

    def round(
        self, body: Callable[[], T], on_wait: Callable[[float], None]
    ) -> tuple[T, float | None]:
        attempts = 0 if self.seen.noisy else self.extra_attempts
        for attempt in range(attempts + 1):
            if not self.seen.noisy:
                self.settle(on_wait)
            stop = self.meter()
            result = body()
            load = stop()
            if load is None or load <= self.threshold:
                break
            if attempt == attempts:
                self.seen.noisy = True
                break
            self.seen.disturbed_rounds += 1
            log.info("a round ran beside %.2f cores of other load: timing it again", load)
        self.seen.saw(load)  # the round kept: what its figures were measured beside
        return result, load
