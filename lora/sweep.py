"""A budgeted search of LoRA recipes: the training side's counterpart of the tuner.

Optuna samples each trial's recipe from a search space (TPE, seeded, its study kept in
SQLite beside the trials, so an interrupted sweep resumes where it stopped); the first
trial is always the current defaults, so the search is measured against them. Each
trial trains an adapter and scores it on the development split; what it cost in
device-seconds (training and evaluation) is charged to the budget. A trial whose
estimated cost no longer fits what is left is skipped unrun, and the search ends when
not even the cheapest recipe would fit.

The estimate: a step's work grows with its rows and each row's texts (a query, its
positive and N mined negatives), so the cost of a text-row is learned from the trials
run so far (their median) and a recipe's is steps x batch x (2 + N) of them.

This module is the search alone: how a trial trains and is scored is the ``Runner``
passed in (``flotilla.sweep`` runs `lora train` in a child process and scores through
the pipeline and store); the table and the figure are drawn from what it returns.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol, get_args

from pydantic import BaseModel, Field, model_validator

from lora.config import Batches, TrainConfig

SWEPT = (
    "lora_rank",
    "lora_targets",
    "train_lr",
    "train_scale",
    "train_max_steps",
    "train_negatives",
    "train_batch_size",
    "train_batches",
)


class SearchSpace(BaseModel):
    """What a sweep may choose. A list is a choice among its values; ``train_lr`` is a
    log-uniform range. A one-value list fixes that knob; ``pairs`` names training sets
    given to the sweep (empty: the one). Alpha follows the rank (alpha = 2 x rank, the
    defaults' ratio), so the update's scale stays put while its capacity changes."""

    lora_rank: list[int] = Field(default_factory=lambda: [8, 16, 32], min_length=1)
    lora_targets: list[str] = Field(
        default_factory=lambda: ["query,key,value,dense", "query,value"], min_length=1
    )
    train_lr: tuple[float, float] = (3e-5, 3e-4)
    train_scale: list[float] = Field(default_factory=lambda: [20.0, 50.0, 100.0], min_length=1)
    train_max_steps: list[int] = Field(default_factory=lambda: [30, 60, 120], min_length=1)
    train_negatives: list[int] = Field(default_factory=lambda: [0, 1, 3], min_length=1)
    train_batch_size: list[int] = Field(default_factory=lambda: [16, 32, 64], min_length=1)
    train_batches: list[Batches] = Field(
        default_factory=lambda: list(get_args(Batches)), min_length=1
    )
    pairs: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> SearchSpace:
        low, high = self.train_lr
        if not 0 < low <= high:
            raise ValueError(f"train_lr must be a range 0 < low <= high, got {self.train_lr}")
        for name in ("lora_rank", "train_max_steps", "train_batch_size"):
            if min(getattr(self, name)) <= 0:
                raise ValueError(f"{name}: every value must be positive")
        if min(self.train_negatives) < 0:
            raise ValueError("train_negatives: no value may be negative")
        if min(self.train_batch_size) < 2:
            raise ValueError("train_batch_size: in-batch negatives need at least 2 rows")
        return self

    def size(self) -> int | None:
        """How many recipes the space holds; None while the learning rate is a range."""
        if self.train_lr[0] < self.train_lr[1]:
            return None
        count = max(len(self.pairs), 1)
        for name in SWEPT:
            if name != "train_lr":
                count *= len(getattr(self, name))
        return count

    def including(self, recipe: Recipe) -> SearchSpace:
        """The space widened to hold ``recipe`` (the defaults are always a candidate)."""
        update: dict[str, Any] = {}
        for name in SWEPT:
            value = getattr(recipe, name)
            if name == "train_lr":
                low, high = self.train_lr
                update[name] = (min(low, value), max(high, value))
            elif value not in getattr(self, name):
                update[name] = sorted([*getattr(self, name), value])
        if self.pairs and recipe.pairs not in self.pairs:
            update["pairs"] = [*self.pairs, recipe.pairs]
        return self.model_copy(update=update)


def text_rows(steps: int, batch_size: int, negatives: int) -> int:
    """Texts a run embeds (a query, its positive and its negatives per row): what its
    cost grows with."""
    return steps * batch_size * (2 + negatives)


RESUMES = "resumes"  # a trial's attribute: the stopped trial it takes the place of


def trial_name(number: int, seed: int = 0) -> str:
    """A trial's folder and adapter name; another seed of it is a name of its own."""
    return f"t{number:03d}" + (f"-seed{seed}" if seed else "")


@dataclass(frozen=True, slots=True)
class Recipe:
    """One trial's knobs: the swept ones (the rest come from the sweep's settings)."""

    lora_rank: int
    lora_targets: str
    train_lr: float
    train_scale: float
    train_max_steps: int
    train_negatives: int
    train_batch_size: int
    train_batches: Batches = "mixed"  # TrainConfig.train_batches: batches of every law or one
    pairs: str = ""  # the training set's name; "" for the sweep's only one

    @property
    def rows(self) -> int:
        return text_rows(self.train_max_steps, self.train_batch_size, self.train_negatives)

    def knobs(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "pairs"}
        out["lora_alpha"] = 2 * self.lora_rank
        return out

    def label(self) -> str:
        targets = "qkvd" if self.lora_targets == "query,key,value,dense" else self.lora_targets
        text = (
            f"r{self.lora_rank} {targets} lr {self.train_lr:.1e} s{self.train_scale:g} "
            f"{self.train_max_steps}x{self.train_batch_size} neg {self.train_negatives}"
        )
        if self.train_batches != "mixed":
            text += f" {self.train_batches} batches"
        return f"{text} [{self.pairs}]" if self.pairs else text


def default_recipe(defaults: TrainConfig, steps: int, pairs: str = "") -> Recipe:
    """The defaults as a recipe (the sweep's first trial)."""
    return Recipe(
        defaults.lora_rank,
        ",".join(defaults.lora_targets),
        defaults.train_lr,
        defaults.train_scale,
        steps,
        defaults.train_negatives,
        defaults.train_batch_size,
        defaults.train_batches,
        pairs,
    )


@dataclass(slots=True)
class Outcome:
    """What a trial measured."""

    ndcg: float  # nDCG@10 on the development split: what the search maximises
    metrics: dict[str, float]
    train_device_s: float
    eval_device_s: float
    tokens: int = 0
    peak_rss_bytes: int = 0
    loss_last: float | None = None
    per_query: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def device_s(self) -> float:
        return self.train_device_s + self.eval_device_s


class Runner(Protocol):
    def __call__(
        self, name: str, recipe: Recipe, seed: int, *, resumes: str | None = None
    ) -> Outcome:
        """Train ``recipe`` with ``seed`` as trial ``name`` and score it. ``resumes``
        names a stopped trial of the same recipe and seed, whose work it may go on from."""
        ...


@dataclass(slots=True)
class Trial:
    number: int
    recipe: Recipe
    seed: int
    state: str  # "done", "skipped" (would not fit the budget) or "failed"
    outcome: Outcome | None = None
    note: str = ""

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "trial": self.number,
            "recipe": asdict(self.recipe),
            "seed": self.seed,
            "state": self.state,
            "note": self.note,
        }
        if self.outcome is not None:
            o = self.outcome
            out |= {
                "ndcg@10": o.ndcg,
                "metrics": o.metrics,
                "device_s": o.device_s,
                "train_device_s": o.train_device_s,
                "eval_device_s": o.eval_device_s,
                "tokens": o.tokens,
                "peak_rss_bytes": o.peak_rss_bytes,
                "loss_last": o.loss_last,
            }
        return out


class Budget:
    """Device-seconds left, and what a recipe is expected to cost."""

    def __init__(self, device_s: float) -> None:
        self.total = device_s
        self.spent = 0.0
        self._per_row: list[float] = []  # device-seconds per text-row of each run trial

    @property
    def left(self) -> float:
        return self.total - self.spent

    def charge(self, recipe: Recipe, outcome: Outcome) -> None:
        self.spent += outcome.device_s
        self._per_row.append(outcome.device_s / recipe.rows)

    def estimate(self, recipe: Recipe | int) -> float | None:
        """Expected device-seconds of a recipe (or of that many text-rows), or None
        before any trial has run."""
        if not self._per_row:
            return None
        rows = recipe if isinstance(recipe, int) else recipe.rows
        return statistics.median(self._per_row) * rows

    def fits(self, recipe: Recipe) -> bool:
        estimate = self.estimate(recipe)
        return self.left > 0 and (estimate is None or estimate <= self.left)


def cheapest(space: SearchSpace) -> int:
    """Text-rows of the cheapest recipe in the space."""
    return text_rows(
        min(space.train_max_steps), min(space.train_batch_size), min(space.train_negatives)
    )


def _suggest(trial: Any, space: SearchSpace) -> Recipe:
    low, high = space.train_lr
    return Recipe(
        lora_rank=trial.suggest_categorical("lora_rank", space.lora_rank),
        lora_targets=trial.suggest_categorical("lora_targets", space.lora_targets),
        train_lr=trial.suggest_float("train_lr", low, high, log=True) if low < high else low,
        train_scale=trial.suggest_categorical("train_scale", space.train_scale),
        train_max_steps=trial.suggest_categorical("train_max_steps", space.train_max_steps),
        train_negatives=trial.suggest_categorical("train_negatives", space.train_negatives),
        train_batch_size=trial.suggest_categorical("train_batch_size", space.train_batch_size),
        train_batches=trial.suggest_categorical("train_batches", space.train_batches),
        pairs=trial.suggest_categorical("pairs", space.pairs) if space.pairs else "",
    )


def _as_params(recipe: Recipe, space: SearchSpace) -> dict[str, Any]:
    """A recipe as the study's parameters (for enqueueing the defaults)."""
    params = {k: v for k, v in asdict(recipe).items() if k != "pairs"}
    if space.train_lr[0] == space.train_lr[1]:
        params.pop("train_lr")
    if space.pairs:
        params["pairs"] = recipe.pairs
    return params


def _from_attrs(number: int, attrs: Mapping[str, Any]) -> Trial:
    """A trial of an earlier run of the same study, as its attributes recorded it."""
    outcome = attrs.get("outcome")
    return Trial(
        number,
        Recipe(**attrs["recipe"]),
        int(attrs["seed"]),
        str(attrs["state"]),
        Outcome(**outcome) if outcome is not None else None,
        str(attrs.get("note", "")),
    )


def _study(storage: Path, seed: int) -> Any:
    """The sweep's Optuna study in ``storage``, an earlier run's when there is one."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name="lora-sweep",
        storage=f"sqlite:///{storage}",
        load_if_exists=True,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed),
    )


def _earlier_trials(study: Any, budget: Budget) -> list[Trial]:
    """The trials an earlier run recorded, what they cost charged to ``budget``."""
    trials: list[Trial] = []
    for frozen in study.get_trials(deepcopy=False):
        if "state" in frozen.user_attrs:
            done = _from_attrs(frozen.number, frozen.user_attrs)
            trials.append(done)
            if done.outcome is not None:
                budget.charge(done.recipe, done.outcome)
    return trials


def _exhausted(
    space: SearchSpace, budget: Budget, tried: set[Recipe], skipped_in_a_row: int
) -> bool:
    """Whether asking for another recipe is pointless."""
    if (budget.estimate(cheapest(space)) or 0.0) > budget.left or skipped_in_a_row >= 20:
        return True  # not even the cheapest recipe fits (or the sampler keeps offering misfits)
    return len(tried) == space.size()  # every recipe of a finite space has run


def _skip_trial(study: Any, trial: Any, recipe: Recipe, budget: Budget) -> Trial:
    """A recipe that would not fit what is left, recorded unrun."""
    import optuna

    estimate = budget.estimate(recipe) or 0.0
    record = Trial(trial.number, recipe, 0, "skipped")
    record.note = f"estimated {estimate:,.0f} device-s, {budget.left:,.0f} left"
    _finish(study, trial, record, optuna.trial.TrialState.PRUNED)
    return record


def _run_trial(run: Runner, study: Any, trial: Any, recipe: Recipe, budget: Budget) -> Trial:
    """Train and score a recipe, its cost charged to ``budget`` when it ran through."""
    import optuna

    record = Trial(trial.number, recipe, 0, "done")
    try:
        record.outcome = run(
            trial_name(trial.number),
            recipe,
            record.seed,
            resumes=trial.user_attrs.get(RESUMES),
        )
    except TrialFailed as exc:
        record.state, record.note = "failed", str(exc)
        _finish(study, trial, record, optuna.trial.TrialState.FAIL)
    except SweepStopped:
        # not a result: unrecorded (no state), and first in line when it resumes,
        # naming the trial whose work it goes on from
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={RESUMES: trial_name(trial.number)})
        raise
    else:
        budget.charge(recipe, record.outcome)
        _finish(study, trial, record, value=record.outcome.ndcg)
    return record


def search(
    run: Runner,
    space: SearchSpace,
    *,
    first: Recipe,
    budget_device_s: float,
    storage: Path,
    seed: int = 0,
    max_trials: int = 0,
    on_trial: Callable[[Trial, Budget], None] | None = None,
) -> tuple[list[Trial], Budget]:
    """Trials until the budget is spent (or ``max_trials``, when above 0). Trials of an
    earlier run in ``storage`` count: their cost was spent, their results stand."""
    import optuna

    space = space.including(first)
    study = _study(storage, seed)
    budget = Budget(budget_device_s)
    trials = _earlier_trials(study, budget)
    if not trials:  # the defaults first, on each training set: the sets' ablation
        for pairs in space.pairs or [first.pairs]:
            study.enqueue_trial(_as_params(replace(first, pairs=pairs), space))
    tried = {t.recipe for t in trials if t.state != "skipped"}
    skipped_in_a_row = 0
    while budget.left > 0 and (max_trials <= 0 or len(trials) < max_trials):
        if _exhausted(space, budget, tried, skipped_in_a_row):
            break
        trial = study.ask()
        recipe = _suggest(trial, space)
        if recipe in tried:  # the same seed would train the same adapter: not run, not listed
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            skipped_in_a_row += 1
            continue
        if budget.fits(recipe):
            skipped_in_a_row = 0
            record = _run_trial(run, study, trial, recipe, budget)
            tried.add(recipe)
        else:
            skipped_in_a_row += 1
            record = _skip_trial(study, trial, recipe, budget)
        trials.append(record)
        if on_trial is not None:
            on_trial(record, budget)
    return trials, budget


class TrialFailed(RuntimeError):
    """A trial could not train or be scored; the sweep goes on without it."""


class SweepStopped(Exception):
    """The sweep was asked to stop (SIGINT, SIGTERM) during a trial: the trial is not
    failed, and the sweep resumes with it."""


def _finish(
    study: Any, trial: Any, record: Trial, state: Any = None, *, value: float | None = None
) -> None:
    # per-query scores stay in the trial's own file (the runner's), not in the study
    attrs = record.row() | {
        "outcome": None if record.outcome is None else asdict(record.outcome) | {"per_query": {}},
    }
    for key, item in attrs.items():
        trial.set_user_attr(key, item)
    if value is not None:
        study.tell(trial, value)
    else:
        study.tell(trial, state=state)


def best(trials: Sequence[Trial]) -> Trial | None:
    done = [t for t in trials if t.outcome is not None]
    return max(done, key=lambda t: t.outcome.ndcg if t.outcome else 0.0, default=None)


def pareto(trials: Sequence[Trial]) -> list[Trial]:
    """The trials no other beats at once on nDCG@10 and cost, cheapest first."""
    done = sorted(
        (t for t in trials if t.outcome is not None),
        key=lambda t: t.outcome.device_s if t.outcome else 0.0,
    )
    front: list[Trial] = []
    for t in done:
        assert t.outcome is not None
        if not front or t.outcome.ndcg > (front[-1].outcome.ndcg if front[-1].outcome else 0):
            front.append(t)
    return front


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": float(len(values)),
    }


def held_settings(held: TrainConfig) -> str:
    """The settings every trial ran with that are not the defaults, the swept knobs
    left out ("train_loss gist, train_autocast bfloat16"): what a recipe's label omits."""
    swept = {f.name for f in fields(Recipe)} | {"lora_alpha"}
    defaults = TrainConfig().model_dump()
    return ", ".join(
        f"{name} {value}"
        for name, value in held.model_dump().items()
        if name not in swept and value != defaults[name]
    )


def table(trials: Sequence[Trial], baselines: Mapping[str, float]) -> str:
    """Markdown: one row per trial, best nDCG@10 first; the baselines above."""
    lines = [
        "| trial | recipe | seed | nDCG@10 | vs base | device-s | tokens | peak RSS GiB | state |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = baselines.get("base")
    for name, value in baselines.items():
        lines.append(f"| {name} | | | {value:.4f} | | | | | |")
    order = sorted(trials, key=lambda t: -(t.outcome.ndcg if t.outcome else -1.0))
    for t in order:
        o = t.outcome
        if o is None:
            lines.append(
                f"| {t.number} | {t.recipe.label()} | {t.seed} | | | | | | {t.state}: {t.note} |"
            )
            continue
        lift = f"{(o.ndcg - base) / base:+.1%}" if base else ""
        lines.append(
            f"| {t.number} | {t.recipe.label()} | {t.seed} | {o.ndcg:.4f} | {lift} | "
            f"{o.device_s:,.0f} | {o.tokens:,} | {o.peak_rss_bytes / 2**30:.2f} | {t.state} |"
        )
    return "\n".join(lines)


def _coordinates(trials: Sequence[Trial]) -> tuple[list[float], list[float]]:
    """Device-seconds and nDCG@10 of the trials that ran."""
    outcomes = [t.outcome for t in trials if t.outcome]
    return [o.device_s for o in outcomes], [o.ndcg for o in outcomes]


def _draw_trials(ax: Any, done: Sequence[Trial]) -> None:
    """Every trial that ran, numbered as in the table, and the Pareto front through them."""
    ax.scatter(*_coordinates(done), color="tab:blue", label="trial", zorder=3)
    ax.plot(*_coordinates(pareto(done)), color="tab:blue", alpha=0.5, label="Pareto front")
    for t in done:
        assert t.outcome is not None
        ax.annotate(
            str(t.number),
            (t.outcome.device_s, t.outcome.ndcg),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )


def plot(
    trials: Sequence[Trial],
    baselines: Mapping[str, float],
    path: Path,
    *,
    seeds: Sequence[Trial] = (),
    title: str = "",
) -> None:
    """nDCG@10 against device-seconds: every trial, the Pareto front, the baselines as
    lines and the seed spread of the chosen recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    _draw_trials(ax, [t for t in trials if t.outcome is not None])
    if seeds:
        ax.scatter(
            *_coordinates(seeds),
            color="tab:orange",
            marker="x",
            label="chosen recipe, other seeds",
            zorder=4,
        )
    for (name, value), style in zip(baselines.items(), ("--", ":", "-."), strict=False):
        ax.axhline(value, color="gray", linestyle=style, label=name)
    ax.set_xlabel("device-seconds (training + evaluation)")
    ax.set_ylabel("nDCG@10, development split")
    ax.set_title(title or "LoRA recipes: quality against cost")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
