"""The background tune's search: the quick plan goes on to pass shapes and batch budgets;
its budget stops it where it is, and what it measured by then decides (or nothing
changes); each step is a log line. Fake runtimes and a fake clock (test_search's)."""

from __future__ import annotations

import pytest

from embedder.tuned import TunedEntry
from embedder.tuning import background, measure
from embedder.tuning.background import tune_here
from tests.embedder.tuning.test_search import BEHAVIOURS, Clock, loader_for
from tests.fakes import fake_fleet

pytestmark = pytest.mark.usefixtures("registry")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    made = Clock()
    monkeypatch.setattr(measure, "perf_counter", made)
    return made


def run(clock: Clock, budget_s: float) -> TunedEntry | None:
    _, load = loader_for(BEHAVIOURS, clock)
    spec = fake_fleet("m", max_tokens=64).get("m")
    return tune_here(spec, "cpu", 2, budget_s, load, clock)  # type: ignore[arg-type]


def test_the_quick_plan_tunes_shape_and_batch_budget_and_logs_each_step(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger=background.__name__):
        entry = run(clock, budget_s=1e9)
    assert entry is not None
    stages = [r.getMessage() for r in caplog.records if "steps" in r.getMessage()]
    assert any("pass shape" in s for s in stages) and any("batch budget" in s for s in stages)
    assert not any(": threads," in s for s in stages)  # threads stay serving's
    assert any("step 1/" in r.getMessage() for r in caplog.records)


def test_a_spent_budget_lets_what_was_measured_decide(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # The first stage takes 16.2 fake seconds, the shapes 8 more: cut in the shapes.
    with caplog.at_level("WARNING", logger=background.__name__):
        cut = run(clock, budget_s=18.0)
    assert cut is not None
    assert "the best measured so far decides" in caplog.text
    assert cut.profile["runtime"] == "fake" and "budget" in cut.measured.calibration


def test_a_budget_spent_before_anything_passed_changes_nothing(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger=background.__name__):
        assert run(clock, budget_s=0.0) is None
    assert "nothing changes" in caplog.text
