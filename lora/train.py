"""LoRA training of a sentence-transformers encoder on (query, passage) pairs, on
sentence-transformers' own trainer.

``SentenceTransformerTrainer`` runs the loop: peft's LoRA layers put into the model's
transformer (``model.add_adapter``), batches without a repeated query or passage
(``BatchSamplers.NO_DUPLICATES``), the contrastive loss over in-batch negatives
(``MultipleNegativesRankingLoss``, or its GradCache variant
``CachedMultipleNegativesRankingLoss``, which embeds in mini-batches of the serving
profile's pass size and so holds a large batch at the memory of a small one; or
``GISTEmbedLoss`` and its cached variant, which drop the in-batch negatives that the
frozen base scores above the pair's positive), AdamW on the adapter's weights, linear
warm-up and decay, gradients clipped at 1, checkpoints and their resumption.

What flotilla adds on top: the text the model sees is what serving gives it (the
fleet's query and passage prompts put before the text here, as serving puts them, and
the model's own tokenizer cut at ``train_max_seq_tokens``); the tokens it ran, counted
at the collator; the wall and CPU time, the peak memory and the cost; and the manifest
with the base's hash. A checkpoint carries these counts, so a resumed run reports the
whole run.
"""

from __future__ import annotations

import math
import random
import resource
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np
import torch

from embedder.core.device import cpu_model
from lora.callbacks import RUN_KEY_FILE, STATE_FILE, CountingTrainer, Counts, Measure, load_counts
from lora.config import Batches, Prices, TrainConfig
from lora.cost import run_cost
from lora.dataset import Pair, read_pairs
from lora.manifest import (
    AdapterShape,
    BaseInfo,
    Manifest,
    Measured,
    TrainingRecord,
    TrainMetrics,
    weights_sha256,
    write_manifest,
)
from lora.negatives import MiningStats, columns, describe, mine
from lora.pairs import file_sha256
from lora.progress import StepLines

CHECKPOINT_DIR = "checkpoints"
POOLING_MODES = {"mean": "mean", "cls": "cls", "last": "lasttoken"}
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")  # sentence-transformers' order
# Padded tokens per pass for a base outside the fleet: the bundled fleet's profiles.
FORWARD_TOKENS: dict[str, int] = {"cpu": 2048, "cuda": 32768}


class TrainError(RuntimeError):
    """The run cannot start or continue as asked."""


@dataclass(frozen=True, slots=True)
class BaseModelRef:
    path: Path
    name: str | None = None  # the fleet name, when the base came from the fleet
    pooling: Literal["model", "mean", "cls", "last"] = "model"
    forward_tokens: int = 2048  # padded tokens per pass: the fleet profile's, for the device
    # {"query", "passage"} prefixes; None reads them from the model folder (model.prompts)
    prompts: dict[str, str] | None = None


def prompts_of(model: Any) -> dict[str, str]:
    """The base model's query and passage prompts ('' where it has none)."""
    prompts: dict[str, str | None] = dict(getattr(model, "prompts", None) or {})
    passage = next((prompts[k] for k in DOCUMENT_PROMPT_NAMES if prompts.get(k)), "")
    return {"query": prompts.get("query") or "", "passage": passage or ""}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return cpu_model()


# Names architectures give the dropout on attention weights (BERT/XLM-R; most others).
ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attention_dropout")


def _load(base: BaseModelRef, device: torch.device, attention_dropout: float) -> Any:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import AutoConfig

    # Dropout on the attention weights keeps torch's fused attention kernel from running:
    # the weights are materialized and a mask drawn for each (docs/results/lora.md).
    config = AutoConfig.from_pretrained(str(base.path))
    config_kwargs = {k: attention_dropout for k in ATTENTION_DROPOUT_KEYS if hasattr(config, k)}
    model = SentenceTransformer(
        str(base.path),
        device=str(device),
        model_kwargs={"attn_implementation": "sdpa"},
        config_kwargs=config_kwargs,
    )
    if base.pooling != "model":  # train with the pooling serving applies (see the fleet)
        index = next(i for i, m in enumerate(model) if isinstance(m, Pooling))
        dimension = int(model.get_embedding_dimension() or 0)
        model[index] = Pooling(dimension, pooling_mode=POOLING_MODES[base.pooling])
    return model


def _autocast_dtype(config: TrainConfig, device: torch.device) -> torch.dtype | None:
    if config.train_autocast == "bfloat16" or (
        config.train_autocast == "auto" and device.type == "cuda"
    ):
        return torch.bfloat16
    return None


def _versions() -> dict[str, str]:
    out = {}
    for package in ("flotilla", "torch", "transformers", "peft", "sentence-transformers"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _lora_config(config: TrainConfig) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_targets),
        bias="none",
    )


def _add_lora(model: Any, config: TrainConfig) -> None:
    try:
        model.add_adapter(_lora_config(config))
    except ValueError as exc:  # no module matched the targets
        raise TrainError(f"cannot add LoRA to the base: {exc}") from exc


def _guide(base: BaseModelRef, device: torch.device) -> Any:
    """The base, frozen and apart from the model in training, for the GIST losses: its
    view of which in-batch passages are really negatives does not move with training."""
    guide = _load(base, device, attention_dropout=0.0)
    guide.eval()
    guide.requires_grad_(False)
    return guide


def _loss(model: Any, config: TrainConfig, base: BaseModelRef, device: torch.device) -> Any:
    from sentence_transformers.sentence_transformer import losses

    # GradCache: embeddings in mini-batches of at most the profile's pass of real tokens
    # without gradients, then one pass each with them: the memory of a mini-batch, the
    # negatives of the whole batch
    mini_batch, mini_batch_tokens = config.train_mini_batch_size, base.forward_tokens
    if config.train_loss == "cached_mnrl":
        return losses.CachedMultipleNegativesRankingLoss(
            model,
            scale=config.train_scale,
            mini_batch_size=mini_batch,
            mini_batch_num_tokens=mini_batch_tokens,
        )
    if config.train_loss in ("gist", "cached_gist"):
        # margin 0, absolute: a negative the guide scores above the positive is dropped
        guide, temperature = _guide(base, device), 1.0 / config.train_scale
        if config.train_loss == "cached_gist":
            return losses.CachedGISTEmbedLoss(
                model,
                guide,
                temperature=temperature,
                mini_batch_size=mini_batch,
                mini_batch_num_tokens=mini_batch_tokens,
            )
        return losses.GISTEmbedLoss(model, guide, temperature=temperature)
    return losses.MultipleNegativesRankingLoss(model, scale=config.train_scale)


def training_data(
    pairs: Sequence[Pair],
    prompts: dict[str, str],
    negatives: Sequence[list[str]] | None,
    count: int,
    batches: Batches = "mixed",
) -> Any:
    """The pairs with serving's prompts put before the text, as serving puts them (a
    plain prefix, so the tokenizer sees the same string).

    The trainer draws each batch from one data set (sentence-transformers' proportional
    multi-data-set sampler). With mined negatives, the pairs that got some become
    (query, positive, negative_1..N) rows and the rest stay pairs: a data set of each
    shape (the loss takes both). With ``batches="law"`` each law's pairs are data sets
    of their own, so a batch's in-batch negatives are sections of the same law."""
    from datasets import Dataset, DatasetDict

    def prefixed(rows: dict[str, list[str]]) -> Any:
        return Dataset.from_dict(
            {
                name: [
                    (prompts["query"] if name == "query" else prompts["passage"]) + t for t in texts
                ]
                for name, texts in rows.items()
            }
        )

    groups: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        groups.setdefault(pair.law if batches == "law" else "", []).append(i)
    sets: dict[str, dict[str, list[str]]] = {}
    for group, members in groups.items():
        mined = [negatives[i] if negatives is not None else [] for i in members]
        shapes = columns([pairs[i] for i in members], mined, count)
        for shape, rows in shapes.items():
            if rows["query"]:
                sets["/".join(filter(None, (group, shape)))] = rows
    if len(sets) == 1:
        return prefixed(next(iter(sets.values())))
    return DatasetDict({name: prefixed(rows) for name, rows in sets.items()})


def _mine(
    pairs: Sequence[Pair],
    model: Any,
    prompts: dict[str, str],
    config: TrainConfig,
    *,
    quiet: bool,
    stream: TextIO | None,
) -> tuple[list[list[str]] | None, MiningStats | None]:
    """Hard negatives from the base, before the adapter is added (the base's view of
    which passages look alike), or none when the recipe asks for none."""
    if config.train_negatives == 0:
        return None, None
    model.eval()
    with torch.inference_mode():
        mined = mine(
            pairs,
            count=config.train_negatives,
            source=config.train_negatives_from,
            margin=config.train_negatives_margin,
            candidates_per_query=config.train_negatives_candidates,
            model=model,
            prompts=prompts,
            batch_size=max(1, config.train_mini_batch_size * 4),
            quiet=quiet,
        )
    if stream is not None:
        print(describe(mined.stats), file=stream, flush=True)
    return mined.negatives, mined.stats


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.rsplit("-", 1)[1])


def last_checkpoint(folder: Path) -> Path | None:
    """The newest checkpoint in ``folder`` saved whole (its counts are written last)."""
    found = [p for p in folder.glob("checkpoint-*") if (p / STATE_FILE).is_file()]
    return max(found, key=_step_of, default=None)


def _peak_rss_bytes() -> int:
    """The process's resident-memory high-water mark (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _base_model(
    base: BaseModelRef, device: torch.device, config: TrainConfig
) -> tuple[Any, dict[str, str]]:
    """The base as serving runs it: its pooling, its cut and its prompts."""
    model = _load(base, device, config.train_attention_dropout)
    model.max_seq_length = config.train_max_seq_tokens  # serving's cut, the tokenizer's own
    prompts = base.prompts if base.prompts is not None else prompts_of(model)
    return model, prompts


def _checked_pairs(pairs_path: Path) -> list[Pair]:
    """The pairs, refused before any loading when they cannot fill one batch."""
    pairs = read_pairs(pairs_path)
    if len({p.query for p in pairs}) < 2 or len({p.positive for p in pairs}) < 2:
        raise TrainError(f"{pairs_path} yields no batch of two distinct pairs")
    return pairs


def _torch_device(device: Literal["cpu", "cuda"], threads: int) -> torch.device:
    if device == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    return torch.device(device)


def _resume_point(
    checkpoints: Path, key: str, *, resume: bool, stream: TextIO | None
) -> tuple[Path | None, Counts]:
    """The checkpoint to go on from and the counts it carries, or a fresh start."""
    last = last_checkpoint(checkpoints) if resume else None
    if last is None:
        if checkpoints.exists():
            shutil.rmtree(checkpoints)  # an earlier run's, not resumed: its steps would mix in
        return None, Counts()
    if (last / RUN_KEY_FILE).read_text() != key:
        raise TrainError(
            f"the checkpoint in {last} is of another run (data, base or settings differ); "
            "remove it or train into another --out"
        )
    counts = load_counts(last)
    if stream is not None:
        print(f"resuming from {last}", file=stream, flush=True)
    return last, counts


def _arguments(
    config: TrainConfig, checkpoints: Path, device: torch.device, *, bf16: bool, bars: bool
) -> Any:
    """The trainer's settings: the recipe's, plus what flotilla fixes for every run."""
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers

    every = config.train_checkpoint_steps
    return SentenceTransformerTrainingArguments(
        output_dir=str(checkpoints),
        num_train_epochs=config.train_epochs,
        max_steps=config.train_max_steps or -1,
        per_device_train_batch_size=config.train_batch_size,
        learning_rate=config.train_lr,
        weight_decay=0.0,
        warmup_steps=config.train_warmup_ratio,  # below 1: a share of the steps
        lr_scheduler_type="linear",
        max_grad_norm=1.0,
        seed=config.train_seed,
        data_seed=config.train_seed,
        bf16=bf16,
        use_cpu=device.type == "cpu",
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        save_strategy="steps" if every else "epoch",
        save_steps=every or 500,
        save_total_limit=1,
        logging_steps=1,
        logging_strategy="steps",
        report_to="none",
        disable_tqdm=not bars,
        dataloader_num_workers=0,
        gradient_checkpointing=config.train_activations == "recompute",
        # non-reentrant: recomputes through peft's layers with the base's inputs frozen
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )


def _step_lines(
    config: TrainConfig, last: Path | None, *, interval_s: float, stream: TextIO
) -> StepLines:
    return StepLines(
        f"LoRA r={config.lora_rank}",
        0,  # the total is known once the trainer has its batches (set in _fit)
        interval_s=interval_s,
        start_step=_step_of(last) if last is not None else 0,
        stream=stream,
    )


def _fit(
    trainer: CountingTrainer,
    model: Any,
    counts: Counts,
    config: TrainConfig,
    *,
    lines: StepLines | None,
    last: Path | None,
) -> tuple[int, int]:
    """Run the trainer, from ``last`` when resuming: the steps taken, the steps per epoch."""
    from transformers.trainer_callback import PrinterCallback

    trainer.counts = counts
    trainer.remove_callback(PrinterCallback)  # a dict per step; the step lines say it
    per_epoch_steps = len(trainer.get_train_dataloader())
    if lines is not None:
        lines.total = config.train_max_steps or per_epoch_steps * config.train_epochs
    model.train()
    trainer.train(resume_from_checkpoint=str(last) if last is not None else None)
    return int(trainer.state.global_step), per_epoch_steps


def _save_adapter(model: Any, out: Path, checkpoints: Path) -> None:
    model.eval()
    model[0].auto_model.save_pretrained(str(out))  # the adapter alone, peft's files
    (out / "README.md").unlink(missing_ok=True)  # a model-card stub; the manifest says more
    shutil.rmtree(checkpoints, ignore_errors=True)


def _training_record(
    config: TrainConfig,
    pairs_path: Path,
    *,
    pairs: int,
    data_sha: str,
    steps: int,
    per_epoch_steps: int,
    autocast: torch.dtype | None,
    prompts: dict[str, str],
    mining: MiningStats | None,
) -> TrainingRecord:
    return TrainingRecord(
        pairs_file=str(pairs_path),
        pairs=pairs,
        data_sha256=data_sha,
        epochs=math.ceil(steps / per_epoch_steps) if steps else config.train_epochs,
        steps=steps,
        batch_size=config.train_batch_size,
        lr=config.train_lr,
        warmup_ratio=config.train_warmup_ratio,
        max_seq_tokens=config.train_max_seq_tokens,
        scale=config.train_scale,
        seed=config.train_seed,
        autocast=str(autocast).removeprefix("torch.") if autocast else "float32",
        prompts=prompts,
        loss=config.train_loss,
        mini_batch_size=config.train_mini_batch_size,
        gradient_checkpointing=config.train_activations == "recompute",
        attention_dropout=config.train_attention_dropout,
        negatives=mining,
        batches=config.train_batches,
    )


def _train_metrics(counts: Counts) -> TrainMetrics:
    tail = counts.losses[-max(1, len(counts.losses) // 10) :]
    per_epoch: dict[int, list[float]] = {}
    for epoch, loss in zip(counts.loss_epochs, counts.losses, strict=True):
        per_epoch.setdefault(epoch, []).append(loss)
    return TrainMetrics(
        loss_first=counts.losses[0] if counts.losses else float("nan"),
        loss_last=_mean(tail),
        loss_per_epoch=[_mean(per_epoch[e]) for e in sorted(per_epoch)],
    )


def _measured(counts: Counts, started: tuple[float, float], device: torch.device) -> Measured:
    """The whole run's times, throughput and memory; a resumed run's earlier part included."""
    return Measured(
        wall_s=counts.earlier_wall_s + time.perf_counter() - started[0],
        train_s=counts.train_s,
        device=device.type,
        device_name=_device_name(device),
        threads=torch.get_num_threads() if device.type == "cpu" else 1,
        cpu_process_s=counts.earlier_cpu_s + time.process_time() - started[1],
        tokens=counts.tokens,
        padded_tokens=counts.padded_tokens,
        tokens_per_s=counts.tokens / counts.train_s if counts.train_s else 0.0,
        train_cpu_s=counts.train_cpu_s,
        tokens_per_core_s=counts.tokens / counts.train_cpu_s if counts.train_cpu_s else 0.0,
        pairs_per_s=counts.pairs / counts.train_s if counts.train_s else 0.0,
        peak_rss_bytes=_peak_rss_bytes(),
        peak_device_bytes=(
            int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
        ),
    )


def _manifest(
    base: BaseModelRef,
    base_sha: str,
    config: TrainConfig,
    training: TrainingRecord,
    counts: Counts,
    started: tuple[float, float],
    device: torch.device,
    prices: Prices,
) -> Manifest:
    measured = _measured(counts, started, device)
    return Manifest(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        base=BaseInfo(base.name, str(base.path), base_sha),
        adapter=AdapterShape(
            config.lora_rank, config.lora_alpha, config.lora_dropout, list(config.lora_targets)
        ),
        training=training,
        metrics=_train_metrics(counts),
        measured=measured,
        cost=run_cost(
            device=measured.device,
            device_name=measured.device_name,
            units=measured.threads,
            wall_s=measured.wall_s,
            prices=prices,
        ),
        versions=_versions(),
    )


def train(
    base: BaseModelRef,
    pairs_path: Path,
    out: Path,
    config: TrainConfig,
    prices: Prices,
    *,
    device: Literal["cpu", "cuda"] = "cpu",
    threads: int = 0,
    resume: bool = False,
    show_progress: bool = True,
    progress_interval_s: float = 5.0,
    progress_stream: TextIO | None = None,
) -> Manifest:
    """Train an adapter on ``pairs_path`` and write it, with its manifest, to ``out``."""
    started = (time.perf_counter(), time.process_time())
    pairs = _checked_pairs(pairs_path)
    data_sha = file_sha256(pairs_path)
    torch_device = _torch_device(device, threads)
    seed_everything(config.train_seed)
    model, prompts = _base_model(base, torch_device, config)
    base_sha = weights_sha256(base.path)
    stream = progress_stream if progress_stream is not None else sys.stderr
    on_terminal = stream.isatty()
    notes = stream if show_progress else None
    bars = show_progress and on_terminal  # tqdm's bars on a terminal, plain lines elsewhere
    negatives, mining = _mine(pairs, model, prompts, config, quiet=not bars, stream=notes)
    _add_lora(model, config)

    key = f"{data_sha}/{base_sha}/{config.model_dump_json()}"
    checkpoints = out / CHECKPOINT_DIR
    out.mkdir(parents=True, exist_ok=True)
    last, counts = _resume_point(checkpoints, key, resume=resume, stream=notes)
    autocast = _autocast_dtype(config, torch_device)
    lines = None
    if show_progress and not on_terminal:
        lines = _step_lines(config, last, interval_s=progress_interval_s, stream=stream)
    trainer = CountingTrainer(
        model=model,
        args=_arguments(config, checkpoints, torch_device, bf16=autocast is not None, bars=bars),
        train_dataset=training_data(
            pairs, prompts, negatives, config.train_negatives, config.train_batches
        ),
        loss=_loss(model, config, base, torch_device),
        callbacks=[Measure(counts, lines=lines, started=started, run_key=key)],
    )
    steps, per_epoch_steps = _fit(trainer, model, counts, config, lines=lines, last=last)
    _save_adapter(model, out, checkpoints)

    training = _training_record(
        config,
        pairs_path,
        pairs=len(pairs),
        data_sha=data_sha,
        steps=steps,
        per_epoch_steps=per_epoch_steps,
        autocast=autocast,
        prompts=prompts,
        mining=mining,
    )
    manifest = _manifest(base, base_sha, config, training, counts, started, torch_device, prices)
    write_manifest(out, manifest)
    return manifest
