"""The quiet checks: other processes' load from two samples, waiting for it to fall
(bounded), timing a disturbed round again (bounded), and the real /proc/stat reading a
busy process beside this one."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from embedder.tuning import quiet
from embedder.tuning.quiet import CpuSample, Quiet, other_cores, proc_meter


class ScriptedMeter:
    """Each interval measured reads the next load of the script; then ``then`` forever.
    ``intervals`` counts them."""

    def __init__(self, script: Iterable[float | None] = (), then: float | None = 0.0) -> None:
        self.script, self.then = list(script), then
        self.intervals = 0

    def __call__(self) -> Callable[[], float | None]:
        def stop() -> float | None:
            self.intervals += 1
            return self.script.pop(0) if self.script else self.then

        return stop


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def quiet_with(meter: ScriptedMeter, sleeps: Sleeps, **kwargs: float) -> Quiet:
    return Quiet(meter, sleep=sleeps, wait_s=3.0, poll_s=0.5, **kwargs)  # type: ignore[arg-type]


def test_other_cores_is_the_machine_s_busy_time_less_this_process_s() -> None:
    before = CpuSample(wall_s=10.0, busy_s=100.0, own_s=5.0)
    after = CpuSample(wall_s=12.0, busy_s=104.0, own_s=7.0)  # 4 busy, 2 of them ours
    assert other_cores(before, after) == pytest.approx(1.0)
    assert other_cores(after, after) == 0.0
    ours_only = CpuSample(wall_s=12.0, busy_s=101.9, own_s=7.0)  # ticks coarser than ours
    assert other_cores(before, ours_only) == 0.0


def test_waiting_for_quiet_is_bounded_and_said_once() -> None:
    sleeps, told = Sleeps(), []
    waiter = quiet_with(ScriptedMeter(then=1.0), sleeps)
    load = waiter.settle(told.append)
    assert load == 1.0  # still busy: it gives up and says what it saw
    assert told == [1.0]
    assert sum(sleeps) == pytest.approx(0.5 + 3.0)  # the first check, then at most wait_s
    assert waiter.seen.waited_s == pytest.approx(3.0)


def test_waiting_stops_when_the_load_falls() -> None:
    sleeps, told = Sleeps(), []
    waiter = quiet_with(ScriptedMeter([1.0, 0.9, 0.1]), sleeps)
    assert waiter.settle(told.append) == 0.1
    assert len(sleeps) == 3 and waiter.seen.waited_s == pytest.approx(1.0)
    assert told == [1.0]


def test_a_disturbed_round_is_timed_again_and_recorded() -> None:
    # settle: quiet; the round: 1.5 cores beside it; settle again, the round again: quiet
    meter, runs = ScriptedMeter([0.0, 1.5, 0.0, 0.1]), []

    def body() -> int:
        runs.append(len(runs))
        return len(runs)

    waiter = quiet_with(meter, Sleeps())
    result, load = waiter.round(body, lambda load: None)
    assert runs == [0, 1] and result == 2  # the second timing is the one kept
    assert load == 0.1
    assert waiter.seen.disturbed_rounds == 1 and not waiter.seen.noisy
    assert waiter.seen.max_other_cores == 0.1  # the kept round's, not the discarded one's


def test_a_round_disturbed_every_time_makes_the_search_noisy_and_stops_waiting() -> None:
    meter, sleeps, runs = ScriptedMeter(then=2.0), Sleeps(), []
    waiter = quiet_with(meter, sleeps, extra_attempts=2)
    waiter.round(lambda: runs.append(1), lambda load: None)
    assert len(runs) == 3  # the round and two more attempts
    assert waiter.seen.noisy and waiter.seen.disturbed_rounds == 2
    assert waiter.seen.max_other_cores == 2.0
    waited, intervals = sum(sleeps), meter.intervals
    waiter.round(lambda: runs.append(1), lambda load: None)
    assert len(runs) == 4 and sum(sleeps) == waited  # once noisy: no waiting, no repeat
    assert meter.intervals == intervals + 1  # but the load is still measured


def test_an_unknown_load_runs_the_round_once_unchecked() -> None:
    waiter = quiet_with(ScriptedMeter(then=None), Sleeps())
    result, load = waiter.round(lambda: "timed", lambda load: None)
    assert (result, load) == ("timed", None)
    assert not waiter.seen.known and waiter.seen.max_other_cores is None


def test_without_proc_stat_the_load_is_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(quiet, "PROC_STAT", tmp_path / "absent")
    assert quiet.proc_sample() is None
    assert proc_meter()() is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
def test_the_real_meter_sees_a_busy_process_beside_this_one() -> None:
    """Deliberate background load: a busy loop on one core for about 1.5 s."""
    busy = [sys.executable, "-c", "while True: pass"]
    if shutil.which("taskset"):
        busy = ["taskset", "-c", "0", *busy]
    with subprocess.Popen(busy) as proc:
        try:
            time.sleep(0.3)  # let it start spinning
            stop = proc_meter()
            time.sleep(1.2)
            load = stop()
        finally:
            proc.kill()
    assert load is not None and load >= 0.5
