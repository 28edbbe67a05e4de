"""`flotilla lora sweep`: the recipe search of ``lora.sweep``, each trial trained by
`flotilla lora train` in a child process and scored through the local stack.

A child per trial: each run's peak memory is its own (``ru_maxrss`` is a process's
high-water mark), and a trial that fails (out of memory, a bad recipe) fails alone.
The knobs reach it as ``FLOTILLA_*`` environment variables, the settings' own second
spelling, so every setting the sweep was given holds in its trials too.
SIGINT and SIGTERM stop the sweep within a second or two: the child, in a session of
its own so that a terminal's Ctrl-C reaches the sweep alone, is killed (one step can
outlast a supervisor's grace period; what it keeps is its last checkpoint), the
scoring in hand is cancelled, and the same command resumes with that trial: under the
number it gets then, it takes over the stopped one's folder, so an adapter trained
before the stop is scored, not trained again, and a training stopped midway goes on
from its last checkpoint (``--train-checkpoint-steps``; by default only each epoch's end).

One stack serves the whole sweep: the base model loads once, the base and BM25 are
scored once, and each trial's adapter is registered under the stack's adapters
directory, where the worker finds it on its first request (as a server would), and
scored as ``BASE:tNNN`` in a collection of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import SecretStr

from embedder.core.adapters import AdapterCatalog
from embedder.core.errors import FlotillaError
from embedder.tasks.fleet import load_fleet
from flotilla import wiring
from flotilla.settings import LoraSettings, setting_values
from flotilla.signals import stop_event, stopped_first
from lora.compare import compare, describe
from lora.config import TrainConfig
from lora.dataset import read_corpus, read_qrels, read_queries
from lora.evaluate import EvalError, SystemResult, dense_system, score
from lora.manifest import read_manifest
from lora.metrics import Qrels
from lora.sweep import (
    Budget,
    Outcome,
    Recipe,
    SearchSpace,
    SweepStopped,
    Trial,
    TrialFailed,
    best,
    default_recipe,
    held_settings,
    plot,
    search,
    spread,
    table,
    trial_name,
    write_json,
)

T = TypeVar("T")

LOG_TAIL = 2000  # characters of a failed trial's log quoted in its note


def _env(settings: LoraSettings, recipe: Recipe, seed: int) -> dict[str, str]:
    """The child's environment: the settings the sweep was given (its own environment
    is inherited), the recipe's knobs over them."""
    values: dict[str, Any] = setting_values(settings, given=True)
    values |= recipe.knobs() | {"train_seed": seed}
    env = dict(os.environ)
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, SecretStr):  # its str() is asterisks
            text = value.get_secret_value()
        elif isinstance(value, list | tuple):  # every list setting is read comma-separated
            text = ",".join(map(str, value))
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, SecretStr):  # str() would pass the mask on, not the key
            text = value.get_secret_value()
        else:
            text = str(value)
        env[f"FLOTILLA_{name.upper()}"] = text
    return env


class PipelineRunner:
    """Trains a trial in a child process, then scores it through ``stack`` on ``loop``
    (the sweep's search runs in a thread beside the loop, which calls ``stop``)."""

    def __init__(
        self,
        settings: LoraSettings,
        *,
        base: str,
        pairs: Mapping[str, Path],
        out: Path,
        stack: wiring.LocalStack,
        loop: asyncio.AbstractEventLoop,
        corpus: Mapping[str, str],
        queries: Mapping[str, str],
        qrels: Qrels,
    ) -> None:
        self.settings, self.base, self.pairs, self.out = settings, base, pairs, out
        self.stack, self.loop = stack, loop
        self.corpus, self.queries, self.qrels = corpus, queries, qrels
        self.catalog = AdapterCatalog(load_fleet(settings.fleet), settings.adapters_root)
        self.cores = settings.threads or os.cpu_count() or 1
        self.stopping = threading.Event()
        self._lock = threading.Lock()  # the work in hand, seen by the thread and by stop()
        self._child: subprocess.Popen[bytes] | None = None
        self._scoring: concurrent.futures.Future[SystemResult] | None = None

    def stop(self) -> None:
        """Kill the trial's child or cancel its scoring; the search ends with
        ``SweepStopped`` where it stands."""
        with self._lock:
            self.stopping.set()
            if self._child is not None and self._child.poll() is None:
                self._child.kill()
            if self._scoring is not None:
                self._scoring.cancel()

    def __call__(
        self, name: str, recipe: Recipe, seed: int, *, resumes: str | None = None
    ) -> Outcome:
        folder = self.out / "trials" / name
        if resumes is not None:
            stopped = self.out / "trials" / resumes
            if stopped.is_dir() and not folder.exists():
                stopped.rename(folder)  # its adapter if it was trained, else its checkpoints
        folder.mkdir(parents=True, exist_ok=True)
        if not _trained(folder / "adapter", recipe, seed):
            self._train(folder, recipe, seed, folder / "train.log")
        manifest = read_manifest(folder / "adapter")
        started = time.perf_counter()
        try:
            self.catalog.register(self.base, name, folder / "adapter")
            result = self.scored(f"{self.base}:{name}")
        except (EvalError, FlotillaError) as exc:  # the trial fails, the sweep goes on
            raise TrialFailed(f"scoring failed: {exc}") from exc
        eval_device_s = (time.perf_counter() - started) * self.cores
        (folder / "scores.json").write_text(json.dumps(result.per_query) + "\n")
        return Outcome(
            ndcg=result.metrics["ndcg@10"],
            metrics=result.metrics,
            train_device_s=float(manifest["cost"]["device_seconds"]),
            eval_device_s=eval_device_s,
            tokens=int(manifest["measured"]["tokens"]),
            peak_rss_bytes=int(manifest["measured"]["peak_rss_bytes"]),
            loss_last=float(manifest["metrics"]["loss_last"]),
            per_query=result.per_query,
        )

    def _train(self, folder: Path, recipe: Recipe, seed: int, log: Path) -> None:
        command = [
            sys.executable,
            "-m",
            "flotilla",
            "lora",
            "train",
            "--base",
            self.base,
            "--pairs",
            str(self.pairs[recipe.pairs]),
            "--out",
            str(folder / "adapter"),
        ]
        if (folder / "adapter").is_dir():  # a stopped training of this trial: its checkpoint
            command.append("--resume")
        with log.open("a", encoding="utf-8") as sink, self._lock:
            if self.stopping.is_set():
                raise SweepStopped
            self._child = subprocess.Popen(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=_env(self.settings, recipe, seed),
                start_new_session=True,
            )
        returncode = self._child.wait()
        with self._lock:
            self._child = None
        if self.stopping.is_set():
            raise SweepStopped
        if returncode != 0:
            raise TrialFailed(
                f"lora train exited {returncode}: "
                + log.read_text(encoding="utf-8")[-LOG_TAIL:].strip()
            )

    def scored(self, model: str) -> SystemResult:
        """``score`` run on the loop, from the search's thread, unless the sweep stops."""
        with self._lock:
            if self.stopping.is_set():
                raise SweepStopped
            self._scoring = asyncio.run_coroutine_threadsafe(self.score(model), self.loop)
        try:
            return self._scoring.result()
        except concurrent.futures.CancelledError:
            if self.stopping.is_set():
                raise SweepStopped from None
            raise
        finally:
            with self._lock:
                self._scoring = None

    async def score(self, model: str) -> SystemResult:
        return await dense_system(
            self.stack.core,
            self.stack.store,
            self.corpus,
            self.queries,
            self.qrels,
            collection=self.settings.ingest.collection,
            model=model,
        )


def _trained(adapter: Path, recipe: Recipe, seed: int) -> bool:
    """An adapter of this recipe and seed is already there (a sweep stopped between
    training a trial and scoring it): it is scored, not trained again."""
    try:
        m = read_manifest(adapter)
    except (OSError, ValueError):
        return False
    t = m["training"]
    negatives = (t.get("negatives") or {}).get("per_query", 0)
    return (
        m["adapter"]["rank"] == recipe.lora_rank
        and m["adapter"]["alpha"] == 2 * recipe.lora_rank
        and ",".join(m["adapter"]["targets"]) == recipe.lora_targets
        and t.get("batches", "mixed") == recipe.train_batches
        and (t["lr"], t["steps"], t["batch_size"], t["scale"], t["seed"], negatives)
        == (
            recipe.train_lr,
            recipe.train_max_steps,
            recipe.train_batch_size,
            recipe.train_scale,
            seed,
            recipe.train_negatives,
        )
    )


def _line(trial: Trial, budget: Budget) -> str:
    left = f"{budget.spent:,.0f}/{budget.total:,.0f} device-s spent"
    if trial.outcome is None:
        return f"trial {trial.number} {trial.recipe.label()}: {trial.state} ({trial.note}); {left}"
    o = trial.outcome
    return (
        f"trial {trial.number} {trial.recipe.label()}: nDCG@10 {o.ndcg:.4f}, "
        f"{o.device_s:,.0f} device-s, peak {o.peak_rss_bytes / 2**30:.2f} GiB; {left}"
    )


@dataclass(frozen=True)
class _SearchPlan:
    """What the search runs with, beside the runner."""

    space: SearchSpace
    first: Recipe
    budget_device_s: float
    storage: Path
    sampler_seed: int
    max_trials: int
    seeds: int


def sweep(
    settings: LoraSettings,
    *,
    base: str,
    data: Path,
    pairs: Mapping[str, Path],
    out: Path,
    space: SearchSpace,
    budget_device_s: float,
    first_steps: int,
    seeds: int,
    sampler_seed: int,
    max_trials: int,
) -> dict[str, Any]:
    """Score the base and BM25, search, train the chosen recipe's other seeds, report."""
    from lora.bm25 import bm25_run

    corpus = read_corpus(data / "corpus.jsonl")
    qrels = read_qrels(data / "qrels.tsv")
    queries = {q: t for q, t in read_queries(data / "queries.jsonl").items() if q in qrels}
    out.mkdir(parents=True, exist_ok=True)
    settings = settings.updated(
        auto_truncate=True,
        chunking=False,
        data_dir=out / "serve",
        adapters_dir=out / "serve" / "adapters",
    )
    bm25 = score("bm25", "bm25", bm25_run(corpus, queries, language="de"), qrels)
    held = TrainConfig.model_validate(settings.model_dump())  # what no trial changes
    first = default_recipe(held, first_steps, _first(space))
    plan = _SearchPlan(
        space, first, budget_device_s, out / "study.db", sampler_seed, max_trials, seeds
    )

    def runner_on(stack: wiring.LocalStack) -> PipelineRunner:
        return PipelineRunner(
            settings, base=base, pairs=pairs, out=out, stack=stack,
            loop=asyncio.get_running_loop(), corpus=corpus, queries=queries, qrels=qrels,
        )  # fmt: skip

    base_result, base_device_s, trials, budget, others = asyncio.run(
        _search_on_stack(settings, base, runner_on, plan, bm25.metrics["ndcg@10"])
    )
    baselines = {"base": base_result.metrics["ndcg@10"], "bm25": bm25.metrics["ndcg@10"]}
    return _report(
        out,
        trials,
        others,
        best(trials),
        budget,
        baselines,
        base,
        base_result,
        base_device_s,
        qrels,
        held,
    )


async def _search_on_stack(
    settings: LoraSettings,
    base: str,
    runner_on: Callable[[wiring.LocalStack], PipelineRunner],
    plan: _SearchPlan,
    bm25_ndcg: float,
) -> tuple[SystemResult, float, list[Trial], Budget, list[Trial]]:
    """On a stack serving ``base`` (taking the trials' adapters as they come): the base's
    score, the search, then the chosen recipe's other seeds."""
    stop = stop_event()  # before loading: a stop while loading is seen once it is done
    async with wiring.running_stack(settings, models=[base], with_adapters=[base]) as stack:
        runner = runner_on(stack)
        started = time.perf_counter()
        base_result = await _unless_stopped(asyncio.to_thread(runner.scored, base), runner, stop)
        base_device_s = (time.perf_counter() - started) * runner.cores
        print(
            f"{base}: nDCG@10 {base_result.metrics['ndcg@10']:.4f}; BM25 {bm25_ndcg:.4f} "
            f"({len(runner.queries)} queries, {len(runner.corpus)} passages)",
            flush=True,
        )
        trials, budget = await _unless_stopped(
            asyncio.to_thread(_search, runner, plan), runner, stop
        )
        others = await _unless_stopped(
            asyncio.to_thread(_other_seeds, runner, best(trials), plan.seeds), runner, stop
        )
    return base_result, base_device_s, trials, budget, others


def _search(runner: PipelineRunner, plan: _SearchPlan) -> tuple[list[Trial], Budget]:
    return search(
        runner,
        plan.space,
        first=plan.first,
        budget_device_s=plan.budget_device_s,
        storage=plan.storage,
        seed=plan.sampler_seed,
        max_trials=plan.max_trials,
        on_trial=lambda t, b: print(_line(t, b), flush=True),
    )


async def _unless_stopped(work: Awaitable[T], runner: PipelineRunner, stop: asyncio.Event) -> T:
    """``work`` (the runner's, in a thread), stopped through the runner if ``stop`` comes
    first: the thread then ends soon, by raising ``SweepStopped``."""
    working = asyncio.ensure_future(work)
    if await stopped_first(working, stop):
        runner.stop()
    return await working


def _other_seeds(runner: PipelineRunner, chosen: Trial | None, seeds: int) -> list[Trial]:
    """The chosen recipe trained again with seeds 1 .. seeds - 1 (its trial had seed 0)."""
    if chosen is None:
        return []
    others: list[Trial] = []
    for seed in range(1, seeds):
        print(f"seed {seed} of the chosen recipe {chosen.recipe.label()}", flush=True)
        try:
            outcome = runner(trial_name(chosen.number, seed), chosen.recipe, seed)
        except TrialFailed as exc:
            others.append(Trial(chosen.number, chosen.recipe, seed, "failed", None, str(exc)))
        else:
            others.append(Trial(chosen.number, chosen.recipe, seed, "done", outcome))
    return others


def _first(space: SearchSpace) -> str:
    return space.pairs[0] if space.pairs else ""


def _report(
    out: Path,
    trials: list[Trial],
    seeds: list[Trial],
    chosen: Trial | None,
    budget: Budget,
    baselines: dict[str, float],
    base: str,
    base_result: SystemResult,
    base_device_s: float,
    qrels: Qrels,
    held: TrainConfig,
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "base": base,
        "settings": held.model_dump(mode="json"),  # every trial's, under its recipe's knobs
        "baselines": {"base": base_result.metrics, "base_device_s": base_device_s}
        | {"bm25_ndcg@10": baselines["bm25"]},
        "budget_device_s": budget.total,
        "spent_device_s": budget.spent,
        "trials": [t.row() for t in trials],
    }
    text = table(trials, baselines)
    changed = held_settings(held)
    if changed:
        text = f"every trial: {changed}\n\n{text}"
    if chosen is not None and chosen.outcome is not None:
        if not chosen.outcome.per_query:  # a trial of an earlier run: its scores' file
            scores = out / "trials" / trial_name(chosen.number) / "scores.json"
            chosen.outcome.per_query = json.loads(scores.read_text(encoding="utf-8"))
        comparison = compare(
            (base, base_result.per_query),
            (f"trial {chosen.number}", chosen.outcome.per_query),
            qrels,
        )
        s = spread([chosen.outcome.ndcg] + [t.outcome.ndcg for t in seeds if t.outcome])
        document["chosen"] = {
            "trial": chosen.number,
            "recipe": chosen.recipe.knobs() | {"pairs": chosen.recipe.pairs},
            "comparison": comparison.as_dict(),
            "seeds": [chosen.row()] + [t.row() for t in seeds],
            "seed_spread": s,
        }
        # the whole run: the held settings under the chosen knobs, to train it again
        write_json(out / "recipe.json", document["settings"] | document["chosen"]["recipe"])
        text += (
            f"\n\nchosen: trial {chosen.number}, {chosen.recipe.label()}\n"
            f"{describe(comparison)}\n"
            f"over {int(s['n'])} seeds: nDCG@10 {s['mean']:.4f} ± {s['stdev']:.4f} "
            f"(min {s['min']:.4f}, max {s['max']:.4f})"
        )
    write_json(out / "sweep.json", document)
    (out / "sweep.md").write_text(text + "\n", encoding="utf-8")
    plot(trials, baselines, out / "sweep.png", seeds=seeds, title=f"{base}: LoRA recipes")
    print(text)
    print(f"report: {out}/sweep.json, sweep.md, sweep.png" + (", recipe.json" if chosen else ""))
    return document
