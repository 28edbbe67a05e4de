"""``flotilla lora``: build pairs and an evaluation set, train an adapter, search recipes,
project the cost, register an adapter for serving. Mounted on the ``flotilla`` app by
``flotilla.cli``; the commands take their settings as flags (``flotilla.flags``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flotilla.flags import (
    ADAPTERS,
    MODELS,
    PROFILES,
    PROGRESS,
    settings_flags,
)
from flotilla.settings import LoraSettings, Settings
from lora.config import Prices, TrainConfig
from lora.cost import GPU_PRICE_FIELDS

if TYPE_CHECKING:  # lora.sweep imports optuna: only the sweep command loads it
    from lora.sweep import SearchSpace

lora_app = typer.Typer(
    help="Domain LoRA adapters: build pairs and an evaluation set, train an adapter, project "
    "its cost, register it for serving.",
    no_args_is_help=True,
)


@lora_app.command("add")
@settings_flags({"fleet"} | ADAPTERS)
def lora_add(
    settings: Settings,
    name: Annotated[str, typer.Argument(help="The adapter's name: requests ask for BASE:NAME.")],
    folder: Annotated[Path, typer.Argument(help="A PEFT LoRA folder (adapter_config.json).")],
    base: Annotated[
        str | None, typer.Option("--base", help="The fleet model it adapts (default: the first).")
    ] = None,
) -> None:
    """Register an adapter: validated, then copied under --adapters-dir, where running
    servers and workers sharing that directory find it on its first request."""
    from embedder.core.adapters import AdapterCatalog
    from embedder.core.errors import FlotillaError
    from embedder.tasks.fleet import load_fleet

    fleet = load_fleet(settings.fleet)
    catalog = AdapterCatalog(fleet, settings.adapters_root)
    try:
        info = catalog.register(base or fleet.default_model, name, folder)
    except FlotillaError as exc:
        raise typer.BadParameter(exc.message) from exc
    rank = f", rank {info.rank}" if info.rank else ""
    typer.echo(f"registered {info.base}:{info.name} ({info.folder}{rank})")


lora_data_app = typer.Typer(
    help="Build training pairs and a held-out retrieval set.", no_args_is_help=True
)
lora_app.add_typer(lora_data_app, name="data")


@lora_data_app.command("gesetze")
def lora_data_gesetze(
    src: Annotated[
        Path, typer.Option("--src", help="A folder of laws as Markdown (gesetze/*.md format).")
    ],
    out: Annotated[Path, typer.Option("--out", help="Where the files go.")] = Path(
        "lora-data/gesetze"
    ),
    eval_fraction: Annotated[
        float,
        typer.Option(
            help="Share of sections, in whole laws, held out for evaluation; 0 trains on "
            "every law (the adapter that ships, once a split chose its recipe)."
        ),
    ] = 0.2,
    eval_laws: Annotated[
        str, typer.Option(help="Hold out these laws (file stems, comma-separated) instead.")
    ] = "",
    seed: Annotated[int, typer.Option(help="Seeds the choice of held-out laws.")] = 0,
    eval_only: Annotated[
        bool,
        typer.Option(
            "--eval-only",
            help="Hold nothing for training: every law (or those of --eval-laws) becomes "
            "the evaluation set; no train.jsonl.",
        ),
    ] = False,
    pair_types: Annotated[
        str,
        typer.Option(
            help="Training pairs, comma-separated: heading (heading -> body), paragraph "
            "(heading -> each paragraph of a longer body), reference (a sentence citing a "
            "section of its law -> that section's body)."
        ),
    ] = "heading",
) -> None:
    """Training pairs from German laws (heading -> body, and the kinds of --pair-types),
    split by whole laws.

    Pairs of the training laws go to train.jsonl; the held-out laws become the evaluation
    set (corpus.jsonl, queries.jsonl, qrels.tsv). --eval-only builds the evaluation set
    alone, for laws an adapter trained elsewhere never saw."""
    from flotilla.lora import data_gesetze
    from lora.pairs import PairKindError, SplitError, pair_kinds

    if not src.is_dir():
        raise typer.BadParameter(f"{src} is not a folder", param_hint="'--src'")
    names = [name.strip().lower() for name in eval_laws.split(",") if name.strip()]
    try:
        kinds = pair_kinds([kind.strip() for kind in pair_types.split(",") if kind.strip()])
    except PairKindError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--pair-types'") from exc
    try:
        data_gesetze(
            src,
            out,
            eval_fraction=eval_fraction,
            seed=seed,
            eval_laws=names,
            eval_only=eval_only,
            pair_types=kinds,
        )
    except SplitError as exc:
        raise typer.BadParameter(str(exc)) from exc


@lora_app.command("train")
@settings_flags(
    MODELS | PROGRESS | set(TrainConfig.model_fields) | set(Prices.model_fields), LoraSettings
)
def lora_train(
    settings: LoraSettings,
    base: Annotated[
        str, typer.Option("--base", help="A fleet model name, or a sentence-transformers folder.")
    ],
    pairs: Annotated[Path, typer.Option("--pairs", help="Training pairs (train.jsonl).")],
    out: Annotated[Path, typer.Option("--out", help="The adapter folder to write.")],
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the checkpoint in --out.")
    ] = False,
) -> None:
    """Train a LoRA adapter (in-batch and, with --train-negatives, mined hard negatives); report
    wall time, device and cost."""
    from embedder.core.errors import ModelNotFound
    from lora.dataset import DatasetError
    from lora.train import TrainError

    if not pairs.is_file():
        raise typer.BadParameter(f"{pairs} is not a file", param_hint="'--pairs'")
    from flotilla.lora import train

    try:
        train(settings, base, pairs, out, resume=resume)
    except ModelNotFound as exc:
        raise typer.BadParameter(exc.message, param_hint="'--base'") from exc
    except (DatasetError, TrainError) as exc:
        raise typer.BadParameter(str(exc)) from exc


def _sweep_sets(data: Path, pairs: list[str]) -> dict[str, Path]:
    """The training sets a sweep chooses among (NAME=PATH), else --data's train.jsonl;
    --data must hold the development split that scores each trial."""
    for name in ("corpus.jsonl", "queries.jsonl", "qrels.tsv"):
        if not (data / name).is_file():
            raise typer.BadParameter(f"{data} holds no {name}", param_hint="'--data'")
    sets: dict[str, Path] = {}
    for item in pairs:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_file():
            raise typer.BadParameter(f"{item!r}: give NAME=PATH of a file", param_hint="'--pairs'")
        sets[name] = Path(path)
    if not sets:
        if not (data / "train.jsonl").is_file():
            raise typer.BadParameter(f"{data} holds no train.jsonl", param_hint="'--data'")
        sets[""] = data / "train.jsonl"
    return sets


def _search_space(space: Path | None, sets: dict[str, Path]) -> SearchSpace:
    """--space's file over the defaults; several named sets make the set a knob."""
    from lora.sweep import SearchSpace

    try:
        loaded = _yaml_or_json(space) if space is not None else {}
        search_space = SearchSpace.model_validate(loaded)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="'--space'") from exc
    if len(sets) > 1 or "" not in sets:
        search_space = search_space.model_copy(update={"pairs": list(sets)})
    return search_space


@lora_app.command("sweep")
@settings_flags(
    MODELS
    | PROFILES
    | PROGRESS
    | {"collection"}
    | set(TrainConfig.model_fields)
    | set(Prices.model_fields),
    LoraSettings,
)
def lora_sweep(
    settings: LoraSettings,
    base: Annotated[str, typer.Option("--base", help="The fleet model the adapters adapt.")],
    data: Annotated[
        Path,
        typer.Option(
            "--data",
            help="A folder from `lora data`: train.jsonl, and the development split's "
            "corpus.jsonl, queries.jsonl and qrels.tsv that score each trial.",
        ),
    ],
    out: Annotated[
        Path,
        typer.Option("--out", help="Trials, study, report (sweep.json, .md, .png), recipe.json."),
    ],
    budget_device_s: Annotated[
        float,
        typer.Option(
            "--budget-device-s",
            help="Device-seconds (CPU: cores x wall) the search may spend, training and "
            "scoring; a trial that would not fit is skipped.",
        ),
    ] = 7200.0,
    space: Annotated[
        Path | None,
        typer.Option(
            "--space",
            help="A YAML or JSON search space (lora.sweep.SearchSpace: lists to choose from, "
            "train_lr as a pair: low, high); keys left out keep their defaults.",
        ),
    ] = None,
    pairs: Annotated[
        list[str] | None,
        typer.Option(
            "--pairs",
            help="NAME=PATH: a training set to choose among (repeat); the sweep then picks "
            "the set as it picks a knob. Default: --data's train.jsonl.",
        ),
    ] = None,
    first_steps: Annotated[
        int, typer.Option(help="Steps of the first trial, the defaults' recipe.")
    ] = 60,
    seeds: Annotated[
        int, typer.Option(help="Seeds the chosen recipe is trained with, its own included.")
    ] = 3,
    sampler_seed: Annotated[int, typer.Option(help="Seeds the search's sampler.")] = 0,
    max_trials: Annotated[
        int, typer.Option(help="Stop after this many trials (0: when the budget is spent).")
    ] = 0,
) -> None:
    """Search LoRA recipes within a device-time budget: each trial trains an adapter and
    scores it on the development split through the pipeline and store; writes a table, a
    PNG of nDCG@10 against cost, the best recipe, and its spread over seeds."""
    from flotilla.sweep import sweep
    from lora.sweep import SweepStopped

    sets = _sweep_sets(data, pairs or [])
    search_space = _search_space(space, sets)
    if budget_device_s <= 0 or seeds < 1:
        raise typer.BadParameter("--budget-device-s must be positive and --seeds at least 1")
    try:
        sweep(
            settings,
            base=base,
            data=data,
            pairs=sets,
            out=out,
            space=search_space,
            budget_device_s=budget_device_s,
            first_steps=first_steps,
            seeds=seeds,
            sampler_seed=sampler_seed,
            max_trials=max_trials,
        )
    except SweepStopped:  # asked to stop: a clean exit, as a server's
        typer.echo(f"sweep stopped; the same command resumes it (finished trials stand: {out})")


def _yaml_or_json(path: Path) -> dict[str, Any]:
    import yaml

    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: a search space is a mapping of knob -> values")
    return loaded


@lora_app.command("cost")
# A projection onto a GPU: the GPU prices, nothing of the run that measured the tokens.
@settings_flags(set(GPU_PRICE_FIELDS.values()), LoraSettings)
def lora_cost(
    settings: LoraSettings,
    adapter: Annotated[Path, typer.Argument(help="An adapter folder written by `lora train`.")],
    tokens_per_s: Annotated[
        float,
        typer.Option(
            "--tokens-per-s", help="Training throughput of the other device (measured there)."
        ),
    ],
    gpu: Annotated[str, typer.Option("--gpu", help="l4, a10 or h100: whose price applies.")],
) -> None:
    """Project a trained adapter's cost onto a GPU: its measured tokens / that GPU's
    training throughput x the GPU's list price."""
    from flotilla.lora import GPUS, cost

    if gpu not in GPUS:
        raise typer.BadParameter(f"choose one of {sorted(GPUS)}", param_hint="'--gpu'")
    if tokens_per_s <= 0:
        raise typer.BadParameter("must be positive", param_hint="'--tokens-per-s'")
    if not (adapter / "flotilla_adapter.json").is_file():
        raise typer.BadParameter(f"{adapter} holds no flotilla_adapter.json")
    cost(settings, adapter, tokens_per_s=tokens_per_s, gpu=gpu)
