"""`flotilla tune`: search this device for each model's fastest profile that computes the
same model, report it (table, JSON, PNG) and write it into the tuned profiles file.

The search and its guard are ``embedder.tuning``; this module picks the calibration
texts and the labelled set (German law from ``lora.gesetze`` for multilingual models,
the Python language reference for English ones), shows progress, and writes results.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from embedder.core.device import detect_device, fingerprint, usable_cores
from embedder.core.errors import FlotillaError
from embedder.core.fleet import DeviceKind, entry_as
from embedder.tasks.embed.runtimes import load_runtime
from embedder.tasks.embed.spec import EncoderSpec
from embedder.tasks.registry import kind_of
from embedder.tuned import Measured, TunedEntry, load_tuned, save_tuned, user_tuned_file
from embedder.tuning.cache import cache_file, identity_of, record
from embedder.tuning.candidates import Plan, plan_for
from embedder.tuning.corpus import TextSection, english_sections, mixed_lengths, paragraphs_of
from embedder.tuning.measure import Workload
from embedder.tuning.quiet import Quiet, Quieting
from embedder.tuning.retrieval import LabelledSet, Qrels, Run
from embedder.tuning.search import Loader, Outcome, Search, Trial, TuneError
from flotilla import __version__
from flotilla.settings import Settings
from flotilla.wiring import configured_fleet
from lora.gesetze import Law, Section, read_laws
from lora.metrics import evaluate
from lora.pairs import retrieval_set

Calibration = Literal["auto", "english", "gesetze"]
# Models whose languages the laws fit; the rest calibrate on English prose.
GERMAN = frozenset({"multilingual-e5-small"})
# Small laws with many short sections: a labelled set that embeds in seconds.
LABELLED_LAWS = ("burlg", "arbzg", "kschg", "tzbfg", "prodhaftg", "agg", "bdsg")
LABELLED_MAX_QUERIES = 300


@dataclass(frozen=True, slots=True)
class Calibrated:
    workload: Workload
    labelled: LabelledSet
    note: str  # what was used, and any fallback


def ndcg10(run: Run, qrels: Qrels) -> float:
    return evaluate(run, qrels)["ndcg@10"]


def _labelled(name: str, laws: Sequence[Law]) -> LabelledSet:
    held = retrieval_set(laws)
    queries = dict(list(held.queries.items())[:LABELLED_MAX_QUERIES])
    qrels = {q: held.qrels[q] for q in queries}
    corpus = {s.id: s.body for s in held.corpus}
    return LabelledSet(name, queries, corpus, qrels, ndcg10)


def _as_law(sections: Sequence[TextSection]) -> Law:
    """The Python reference's sections in the laws' shape, for the same heading -> section
    labelled set (a heading's relevant passages: every section it titles)."""
    return Law(
        "python-reference",
        "PY",
        "Python language reference topics",
        tuple(Section("py", f"s{i}", s.title, s.body) for i, s in enumerate(sections)),
    )


class NoLaws(FlotillaError):
    """German law was asked for and none is where --calibration-dir points, or no
    folder is given."""

    code = "no_calibration_laws"


def calibration(
    spec: EncoderSpec, which: Calibration, laws_dir: Path | None, texts: int, console: Console
) -> Calibrated:
    """German law for ``--calibration gesetze``, and for a multilingual model under
    ``auto`` when ``laws_dir`` is given; English otherwise, saying so for such a model.
    Raises ``NoLaws`` when ``laws_dir`` is asked for and holds no laws."""
    prefix = spec.prompt_prefix(use="document")
    german = which == "gesetze" or (which == "auto" and spec.name in GERMAN)
    if which == "gesetze" and laws_dir is None:
        raise NoLaws(
            "--calibration gesetze reads German laws: give their folder with "
            "--calibration-dir (FLOTILLA_CALIBRATION_DIR)"
        )
    laws = read_laws(laws_dir) if german and laws_dir is not None and laws_dir.is_dir() else []
    if german and laws_dir is not None and not any(law.sections for law in laws):
        raise NoLaws(
            f"no German laws (gesetze/*.md format) at {laws_dir}: point --calibration-dir "
            "(FLOTILLA_CALIBRATION_DIR) at such a folder"
        )
    if laws:
        paragraphs = [p for law in laws for s in law.sections for p in s.body.split("\n")]
        small = [law for law in laws if law.slug in LABELLED_LAWS] or laws[:1]
        slugs = ",".join(law.slug for law in small)
        note = f"German law from {laws_dir} ({len(laws)} laws); labelled set: {slugs}"
        return Calibrated(
            Workload(mixed_lengths(paragraphs, texts), prefix), _labelled(slugs, small), note
        )
    sections = english_sections()
    note = "English: Python's language reference topics (pydoc_data.topics)"
    if german:  # auto, and no folder of laws given
        note += "; no --calibration-dir (FLOTILLA_CALIBRATION_DIR) of German laws given"
        console.print(f"[yellow]{spec.name}: {note}[/]")
    workload = Workload(mixed_lengths(paragraphs_of(sections), texts), prefix)
    return Calibrated(workload, _labelled("python-reference", [_as_law(sections)]), note)


class RichProgress:
    def __init__(self, progress: Progress, model: str) -> None:
        self.progress, self.model = progress, model
        self.task: Any = None

    def stage(self, name: str, steps: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"{self.model}: {name}", total=steps, label="")

    def advance(self, label: str) -> None:
        self.progress.update(self.task, advance=1, label=label)


def _trial_row(t: Trial) -> dict[str, Any]:
    return {
        "stage": t.stage,
        **t.candidate.fields(),
        "tokens_per_s": t.tokens_per_s,
        "worst_cosine": t.verdict.worst_cosine if t.verdict else None,
        "ndcg_at_10": t.verdict.ndcg if t.verdict else None,
        "refused": t.refused,
        "other_load_cores": t.other_load_cores,
    }


def table(outcome: Outcome) -> Table:
    """Every candidate; x is against torch fp32 timed in the same stage's rounds (the
    first and the last stage time it), so a machine's drifting load cancels out."""
    fp32 = {
        t.stage: t.tokens_per_s
        for t in outcome.trials
        if t.candidate == outcome.reference.candidate
    }
    out = Table(title=f"{outcome.model}: every candidate (x: against torch fp32, same stage)")
    columns = ("stage", "runtime/dtype", "pass", "batch", "threads", "tok/s", "x", "worst cos")
    for column in (*columns, "nDCG@10", "verdict"):
        out.add_column(column, justify="right" if column in columns[2:] else "left")
    for t in outcome.trials:
        row = _trial_row(t)
        mark = "[bold green]chosen[/]" if t is outcome.chosen else ("ok" if t.passed else "")
        out.add_row(
            t.stage,
            f"{t.candidate.runtime}/{t.candidate.dtype}",
            f"{t.candidate.forward_tokens}x{t.candidate.forward_max_sequences}",
            str(t.candidate.max_batch_tokens),
            str(t.candidate.threads),
            f"{t.tokens_per_s:,.0f}" if t.tokens_per_s else "-",
            f"{t.tokens_per_s / base:.2f}"
            if t.tokens_per_s and (base := fp32.get(t.stage))
            else "-",
            f"{row['worst_cosine']:.5f}" if row["worst_cosine"] is not None else "-",
            f"{row['ndcg_at_10']:.4f}" if row["ndcg_at_10"] is not None else "-",
            mark or f"[red]refused: {t.refused}[/]",
        )
    return out


def plot(outcome: Outcome, path: Path) -> str:
    """Speed against worst cosine, the chosen point marked; a note when matplotlib is
    missing (it is a bench/dev dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no PNG: matplotlib is not installed (pip install 'flotilla[bench]')"
    measured = [t for t in outcome.trials if t.tokens_per_s and t.verdict]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for passed, colour in ((True, "tab:blue"), (False, "tab:red")):
        pts = [t for t in measured if t.passed == passed]
        ax.scatter(
            [t.verdict.worst_cosine for t in pts if t.verdict],
            [t.tokens_per_s or 0.0 for t in pts],
            c=colour,
            label="passed" if passed else "refused",
            alpha=0.7,
        )
    c = outcome.chosen
    if c.verdict is not None:
        ax.scatter([c.verdict.worst_cosine], [c.tokens_per_s or 0.0], marker="*", s=300, c="gold",
                   edgecolors="black", label=f"chosen: {c.candidate.label}", zorder=3)  # fmt: skip
    ax.axvline(0.999, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("worst cosine to torch fp32 (calibration texts)")
    ax.set_ylabel("real tokens/s")
    ax.set_title(f"flotilla tune: {outcome.model}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"PNG: {path}"


def entry(outcome: Outcome, note: str, command: str) -> TunedEntry:
    c, up, load = outcome.chosen, outcome.runner_up, outcome.load
    most = load.max_other_cores
    return TunedEntry(
        profile=c.candidate.fields(),
        measured=Measured(
            tokens_per_s=round(c.tokens_per_s or 0.0, 1),
            worst_cosine=round(c.verdict.worst_cosine if c.verdict else 0.0, 6),
            ndcg_at_10=c.verdict.ndcg if c.verdict else None,
            ndcg_at_10_fp32=outcome.ndcg_fp32,
            fp32_tokens_per_s=round(outcome.fp32.tokens_per_s or 0.0, 1),
            runner_up={**up.candidate.fields(), "tokens_per_s": round(up.tokens_per_s or 0, 1)}
            if up is not None
            else None,
            calibration=note,
            other_load_cores=None if most is None else round(most, 2),
            disturbed_rounds=load.disturbed_rounds if load.known else None,
            noisy=True if load.noisy else None,
            threads_why=outcome.threads_why,
            date=dt.date.today().isoformat(),
            flotilla_version=__version__,
            command=command,
        ),
    )


class NoisyTune(TuneError):
    """The CPU stayed busy with other processes' work while timing, after waiting and
    repeating: the figures are not this device's own, and no profile is written."""

    code = "noisy_tune"


def load_line(outcome: Outcome) -> str:
    """What the quiet checks saw, for the summary."""
    load = outcome.load
    if not load.known:
        return "other processes' load: unknown here (no /proc/stat): timings unchecked"
    line = (
        f"other processes' load: at most {load.max_other_cores:.2f} cores during the rounds "
        f"kept (threshold {load.threshold_cores:.2f}); {load.disturbed_rounds} rounds timed "
        f"again, {load.waited_s:.0f} s waited for quiet"
    )
    return line + ("; [red]still disturbed after every repeat: noisy[/]" if load.noisy else "")


def refuse_noisy(outcome: Outcome) -> None:
    load = outcome.load
    if load.noisy:
        raise NoisyTune(
            f"{outcome.model}: other processes kept up to {load.max_other_cores:.2f} cores "
            f"busy while timing (over {load.threshold_cores:.2f}), after waiting for quiet "
            f"and timing {load.disturbed_rounds} rounds again: the figures are not this "
            "device's own, so no profile is written. Quiet the machine and tune again, or "
            "pass --allow-noisy to write it with the load recorded."
        )


@dataclass(frozen=True, slots=True)
class Target:
    """Where a tune runs and what it writes."""

    device: DeviceKind
    fingerprint: str
    cores: int
    command: str
    results: Path


def _search(
    settings: Settings, spec: EncoderSpec, cal: Calibrated, plan: Plan, to: Target,
    loader: Loader, quiet: Quieting, console: Console,
) -> Outcome:  # fmt: skip
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[label]}"))  # fmt: skip
    with Progress(*columns, console=console, transient=True) as bar:
        return Search(
            spec,
            to.device,
            loader,
            cal.workload,
            threads=settings.threads or to.cores,
            cores=to.cores,
            plan=plan,
            labelled=cal.labelled,
            progress=RichProgress(bar, spec.name),
            quiet=quiet,
        ).run()


def _report(outcome: Outcome, made: TunedEntry, plan: Plan, to: Target, console: Console) -> None:
    """The table and summary on the terminal; the JSON report and PNG under results."""
    Console(width=None if sys.stdout.isatty() else 160).print(table(outcome))
    console.print(load_line(outcome))
    if outcome.threads_why:
        console.print(f"threads: {outcome.threads_why}")
    stem = to.results / re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{outcome.model}-{to.fingerprint}")
    report = {
        "model": outcome.model,
        "fingerprint": to.fingerprint,
        "plan": {k: getattr(plan, k) for k in plan.__dataclass_fields__},
        "chosen": made.model_dump(mode="json"),
        "load": dataclasses.asdict(outcome.load),
        "trials": [_trial_row(t) for t in outcome.trials],
    }
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    picture = plot(outcome, stem.with_suffix(".png"))
    console.print(f"JSON: {stem.with_suffix('.json')}; {picture}")


def sized(plan: Plan, texts: int | None, repeats: int | None) -> Plan:
    return dataclasses.replace(plan, texts=texts or plan.texts, repeats=repeats or plan.repeats)


def keep_on_this_machine(settings: Settings, spec: EncoderSpec, fp: str, made: TunedEntry) -> Path:
    """The same entry in this machine's cache, which `flotilla serve` reads where the
    tuned file has none: a tune and a restart give the tuned profile, whichever file
    --tuned-file names."""
    path = cache_file(settings.model_cache_dir)
    record(path, spec.name, fp, made, identity_of(spec, path))
    return path


def tune(
    settings: Settings,
    models: Sequence[str],
    *,
    quick: bool = False,
    write: bool = True,
    out: Path | None = None,
    results: Path = Path("tune-results"),
    which: Calibration = "auto",
    plan: Plan | None = None,
    texts: int | None = None,
    repeats: int | None = None,
    allow_noisy: bool = False,
    loader: Loader = load_runtime,
    quiet: Callable[[], Quieting] | None = None,
) -> list[Outcome]:
    """Tune each model; a model timed beside a busy CPU (``NoisyTune``) is written only
    with ``allow_noisy``. ``quiet`` makes each model's quiet checks (``Quiet``'s, on
    /proc/stat, when None)."""
    console = Console(stderr=True)
    fleet = configured_fleet(settings)
    # Unnamed, every model the tuner can time (generation models measure their dtype at
    # load instead, OCR models run float32); named, such a model is refused with the reason.
    named = [fleet.get(name) for name in models] or [
        spec for spec in fleet.models.values() if kind_of(spec.task).tunable
    ]
    specs = [entry_as(spec, EncoderSpec) for spec in named]
    device: DeviceKind = detect_device() if settings.device == "auto" else settings.device
    plan = plan or sized(plan_for(device, quick=quick), texts, repeats)
    command = "flotilla tune " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["tune"] else "tune()"
    to = Target(device, fingerprint(device), usable_cores(), command, results)
    # Never into the installed package: the named file, else the user's own.
    target = out or settings.tuned_file or user_tuned_file(settings.model_cache_dir)
    tuned = load_tuned(target)
    results.mkdir(parents=True, exist_ok=True)
    outcomes = []
    console.print(f"device {to.fingerprint}; figures are best of {plan.repeats} rounds, each "
                  "on a quiet CPU (other processes' load checked)")  # fmt: skip
    for spec in specs:
        cal = calibration(spec, which, settings.calibration_dir, plan.texts, console)
        outcome = _search(settings, spec, cal, plan, to, loader, (quiet or Quiet)(), console)
        outcomes.append(outcome)
        made = entry(outcome, cal.note, command)
        _report(outcome, made, plan, to, console)
        if write and not allow_noisy:
            refuse_noisy(outcome)
        if write:
            tuned = tuned.with_entry(spec.name, to.fingerprint, made)
            console.print(f"{spec.name}: tuned profile written to {save_tuned(tuned, target)}")
            kept = keep_on_this_machine(settings, spec, to.fingerprint, made)
            console.print(f"{spec.name}: and kept for this machine in {kept}")
    return outcomes
