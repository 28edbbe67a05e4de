"""Plain progress lines off a terminal: one every interval, with step, loss, elapsed and
an ETA from the run's own pace."""

from __future__ import annotations

import io

import pytest

from lora.progress import StepLines


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_every_interval_with_step_loss_elapsed_and_eta() -> None:
    clock, out = Clock(), io.StringIO()
    lines = StepLines("LoRA r=16", 60, interval_s=5, stream=out, clock=clock)
    for step in range(1, 11):  # a step every 2 s: a line at steps 3, 5 and 8 (6, 10, 16 s)
        clock.now += 2
        lines.update(step, loss=3.0 - step / 10)
    printed = out.getvalue().splitlines()
    assert printed == [
        "LoRA r=16: step 3/60 (5%), loss 2.7000, elapsed 0:06, ETA 1:54",
        "LoRA r=16: step 6/60 (10%), loss 2.4000, elapsed 0:12, ETA 1:48",
        "LoRA r=16: step 9/60 (15%), loss 2.1000, elapsed 0:18, ETA 1:42",
    ]
    lines.close()  # the last state, once
    assert out.getvalue().splitlines()[-1].startswith("LoRA r=16: step 10/60 (17%), loss 2.0000")
    lines.close()
    assert len(out.getvalue().splitlines()) == 4


def test_a_resumed_run_takes_its_eta_from_its_own_steps() -> None:
    clock, out = Clock(), io.StringIO()
    lines = StepLines("run", 100, interval_s=1, start_step=50, stream=out, clock=clock)
    clock.now += 10
    lines.update(60, loss=1.0)  # 10 steps in 10 s here: 40 left take 40 s, not 8
    assert out.getvalue().strip() == ("run: step 60/100 (60%), loss 1.0000, elapsed 0:10, ETA 0:40")


def test_no_step_yet_has_no_eta_and_the_end_has_none_left() -> None:
    clock, out = Clock(), io.StringIO()
    lines = StepLines("run", 4, interval_s=1, stream=out, clock=clock)
    assert lines.line() == "run: step 0/4 (0%), loss -, elapsed 0:00, ETA ?"
    clock.now += 3725
    lines.update(4, loss=0.5)
    assert out.getvalue().strip() == "run: step 4/4 (100%), loss 0.5000, elapsed 1:02:05, ETA 0:00"
    with pytest.raises(ValueError):
        StepLines("run", 4, interval_s=0)
