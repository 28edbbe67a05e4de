"""The recipe search on a stand-in runner: the budget, the defaults first, resumption,
failures, and the report's pieces (table, figure, Pareto front, seed spread)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lora.config import TrainConfig
from lora.sweep import (
    Outcome,
    Recipe,
    SearchSpace,
    SweepStopped,
    Trial,
    TrialFailed,
    best,
    default_recipe,
    held_settings,
    pareto,
    plot,
    search,
    spread,
    table,
)

PER_ROW_S = 0.01  # the stand-in's device-seconds per text-row: a cost exactly as estimated


class Runner:
    def __init__(self, fail_rank: int | None = None, stop_at_call: int | None = None) -> None:
        self.calls: list[Recipe] = []
        self.names: list[tuple[str, str | None]] = []  # (name, the trial it resumes)
        self.fail_rank = fail_rank
        self.stop_at_call = stop_at_call

    def __call__(
        self, name: str, recipe: Recipe, seed: int, *, resumes: str | None = None
    ) -> Outcome:
        self.calls.append(recipe)
        self.names.append((name, resumes))
        if len(self.calls) == self.stop_at_call:
            raise SweepStopped
        if recipe.lora_rank == self.fail_rank:
            raise TrialFailed("out of memory")
        # quality rises with steps and scale: a landscape the search can climb
        ndcg = 0.5 + recipe.train_max_steps / 1000 + recipe.train_scale / 10_000
        return Outcome(
            ndcg=ndcg,
            metrics={"ndcg@10": ndcg},
            train_device_s=recipe.rows * PER_ROW_S * 0.75,
            eval_device_s=recipe.rows * PER_ROW_S * 0.25,
            tokens=recipe.rows * 100,
            peak_rss_bytes=2**30,
        )


SPACE = SearchSpace(
    lora_rank=[8, 16],
    train_max_steps=[10, 40],
    train_batch_size=[4, 8],
    train_negatives=[0, 2],
    train_scale=[20.0, 100.0],
)
FIRST = default_recipe(TrainConfig(train_batch_size=4), steps=10)


def test_the_first_trial_is_the_defaults_and_the_budget_is_kept(tmp_path: Path) -> None:
    runner = Runner()
    trials, budget = search(
        runner, SPACE, first=FIRST, budget_device_s=20.0, storage=tmp_path / "s.db", seed=1
    )
    assert runner.calls[0] == FIRST
    assert budget.spent <= budget.total  # the estimate is exact here: nothing overruns
    done = [t for t in trials if t.state == "done"]
    assert len(done) == len(runner.calls) >= 2
    # each skipped recipe was estimated to cost more than was left when it came up
    for t in trials:
        if t.state == "skipped":
            assert "device-s" in t.note
    # the search stopped because the cheapest recipe (10 x 4 x 2 rows) no longer fit
    assert budget.left < 10 * 4 * 2 * PER_ROW_S or len(trials) >= 20


def test_an_interrupted_sweep_resumes_without_rerunning(tmp_path: Path) -> None:
    storage = tmp_path / "s.db"
    first_runner = Runner()
    first, _ = search(
        first_runner, SPACE, first=FIRST, budget_device_s=50.0, storage=storage, max_trials=2
    )
    again = Runner()
    trials, budget = search(
        again, SPACE, first=FIRST, budget_device_s=50.0, storage=storage, max_trials=4
    )
    assert [t.number for t in trials[:2]] == [t.number for t in first]
    assert len(trials) == 4 and len(again.calls) <= 2  # only the new ones ran
    ran = [t for t in trials if t.outcome is not None]
    assert budget.spent == pytest.approx(sum(t.outcome.device_s for t in ran if t.outcome))


def test_a_stopped_trial_is_first_when_the_sweep_resumes_and_names_the_one_it_replaces(
    tmp_path: Path,
) -> None:
    storage = tmp_path / "s.db"
    stopped = Runner(stop_at_call=2)
    with pytest.raises(SweepStopped):
        search(stopped, SPACE, first=FIRST, budget_device_s=50.0, storage=storage)
    again = Runner()
    trials, _ = search(again, SPACE, first=FIRST, budget_device_s=50.0, storage=storage)
    assert again.calls[0] == stopped.calls[1]  # the stopped recipe, before anything new
    assert again.names[0] == ("t002", "t001")  # a number of its own; it takes t001's work
    assert [t.number for t in trials[:2]] == [0, 2]  # t001 is no result: not listed
    assert [r for _, r in again.names[1:]] == [None] * (len(again.names) - 1)


def test_one_recipe_on_several_sets_is_an_ablation_run_once_each(tmp_path: Path) -> None:
    fixed = SearchSpace(
        lora_rank=[FIRST.lora_rank],
        lora_targets=[FIRST.lora_targets],
        train_lr=(FIRST.train_lr, FIRST.train_lr),
        train_scale=[FIRST.train_scale],
        train_max_steps=[FIRST.train_max_steps],
        train_negatives=[FIRST.train_negatives],
        train_batch_size=[FIRST.train_batch_size],
        train_batches=[FIRST.train_batches],
        pairs=["heading", "paragraph", "all"],
    )
    runner = Runner()
    first = default_recipe(TrainConfig(train_batch_size=4), steps=10, pairs="heading")
    trials, budget = search(
        runner, fixed, first=first, budget_device_s=1000.0, storage=tmp_path / "s.db"
    )
    # each set once, in the order given, then the search stops: nothing else is left
    assert [r.pairs for r in runner.calls] == ["heading", "paragraph", "all"]
    assert len(trials) == 3 and budget.left > 900
    again = Runner()  # resumed: every recipe has run, so nothing runs again
    resumed, _ = search(
        again, fixed, first=first, budget_device_s=1000.0, storage=tmp_path / "s.db"
    )
    assert again.calls == [] and len(resumed) == 3


def test_a_failed_trial_is_recorded_and_the_search_goes_on(tmp_path: Path) -> None:
    runner = Runner(fail_rank=16)  # the defaults' rank
    trials, _ = search(
        runner, SPACE, first=FIRST, budget_device_s=30.0, storage=tmp_path / "s.db", max_trials=5
    )
    assert trials[0].state == "failed" and "out of memory" in trials[0].note
    assert any(t.state == "done" for t in trials)


def test_report_pieces(tmp_path: Path) -> None:
    def trial(n: int, ndcg: float, cost: float) -> Trial:
        return Trial(n, FIRST, 0, "done", Outcome(ndcg, {"ndcg@10": ndcg}, cost, 0.0))

    trials = [trial(0, 0.60, 100), trial(1, 0.65, 300), trial(2, 0.62, 400), trial(3, 0.70, 900)]
    trials.append(Trial(4, FIRST, 0, "skipped", note="estimated 5,000 device-s, 10 left"))
    assert [t.number for t in pareto(trials)] == [0, 1, 3]
    chosen = best(trials)
    assert chosen is not None and chosen.number == 3
    text = table(trials, {"base": 0.5, "bm25": 0.45})
    rows = text.splitlines()
    assert rows[2].startswith("| base |") and "| 3 |" in rows[4]  # best first after baselines
    assert "+40.0%" in rows[4] and "skipped" in rows[-1]
    s = spread([0.7, 0.68, 0.72])
    assert s["mean"] == pytest.approx(0.7) and s["stdev"] == pytest.approx(0.02)
    plot(trials, {"base": 0.5}, tmp_path / "sweep.png", seeds=trials[:1])
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_space_refuses_what_cannot_train() -> None:
    with pytest.raises(ValueError, match="in-batch negatives"):
        SearchSpace(train_batch_size=[1, 8])
    with pytest.raises(ValueError, match="train_lr"):
        SearchSpace(train_lr=(1e-3, 1e-4))


def test_the_held_settings_name_what_differs_from_the_defaults_and_is_not_swept() -> None:
    held = TrainConfig(train_loss="gist", train_autocast="bfloat16", lora_rank=4, train_lr=3e-4)
    assert held_settings(held) == "train_loss gist, train_autocast bfloat16"
    assert held_settings(TrainConfig()) == ""
    # batches of one law are a swept knob: the recipe's label names them, not the held
    assert held_settings(TrainConfig(train_batches="law")) == ""
    law = default_recipe(TrainConfig(train_batches="law"), steps=10)
    assert law.label().endswith("neg 0 law batches") and FIRST.label().endswith("neg 0")
