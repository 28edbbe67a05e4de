"""LoRA training of a sentence-transformers encoder on (query, passage) pairs.

The loop, in full: pairs into batches without repeats (``lora.batches``); the base
model's query and passage prompts on both sides (the fleet's, which serving applies,
else the model folder's); one forward pass for the queries and one for the passages
through the SentenceTransformer with peft's LoRA layers in its transformer;
cosine similarities x scale, and cross-entropy with each query's own passage as the
target and every other passage in the batch as a negative (InfoNCE, what
sentence-transformers calls MultipleNegativesRankingLoss); AdamW on the adapter's
weights only, linear warm-up and decay, gradients clipped at 1.

Inputs are tokenized the way the serving runtime tokenizes them (the model's own
tokenizer, cut at ``train_max_seq_tokens``), so what the adapter learns is what it will
see. Checkpoints (adapter + optimizer + position) let an interrupted run resume at the
step it reached; the batch order is a function of the seed and the epoch, so it
continues with the batches it would have seen.
"""

from __future__ import annotations

import itertools
import math
import random
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np
import torch
import torch.nn.functional as F
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from embedder.batching import micro_batches
from lora.batches import batches
from lora.config import Prices, TrainConfig
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
from lora.pairs import file_sha256
from lora.progress import StepLines

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "trainer_state.pt"
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


@dataclass(slots=True)
class _Progress:
    """Where the loop is, and what it has measured so far; saved with checkpoints."""

    epoch: int = 0
    batch: int = 0  # batches done in this epoch
    step: int = 0  # optimizer steps done in all
    pairs: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    train_s: float = 0.0
    train_cpu_s: float = 0.0
    earlier_wall_s: float = 0.0  # wall and CPU time of the runs before a resume,
    earlier_cpu_s: float = 0.0  # up to their last checkpoint
    losses: list[float] | None = None
    accuracies: list[float] | None = None


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
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="ignore") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"


def _load(base: BaseModelRef, device: torch.device) -> Any:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    model = SentenceTransformer(str(base.path), device=str(device))
    if base.pooling != "model":  # train with the pooling serving applies (see the fleet)
        index = next(i for i, m in enumerate(model) if isinstance(m, Pooling))
        dimension = int(model.get_embedding_dimension() or 0)
        model[index] = Pooling(dimension, pooling_mode=POOLING_MODES[base.pooling])
    return model


def _with_lora(model: Any, config: TrainConfig) -> Any:
    """Put LoRA layers into the model's transformer; returns the peft model."""
    from peft import LoraConfig, get_peft_model

    transformer = model[0]
    inner = getattr(transformer, "model", None)
    if not isinstance(inner, torch.nn.Module):
        raise TrainError(
            f"the first module of the base ({type(transformer).__name__}) holds no "
            "transformer to adapt"
        )
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_targets),
        bias="none",
    )
    try:
        peft_model = get_peft_model(inner, lora)
    except ValueError as exc:  # no module matched the targets
        raise TrainError(f"cannot add LoRA to {type(inner).__name__}: {exc}") from exc
    transformer.model = peft_model
    return peft_model


def _autocast_dtype(config: TrainConfig, device: torch.device) -> torch.dtype | None:
    if config.train_autocast == "bfloat16" or (
        config.train_autocast == "auto" and device.type == "cuda"
    ):
        return torch.bfloat16
    return None


class _Encoder:
    """Tokenize like the serving runtime, then embed with gradients.

    A batch's texts run in length-sorted passes of at most ``forward_tokens`` padded
    tokens, as the runtime runs them: a short heading no longer pays for the padding of
    the longest passage (a third of the compute on the law pairs when padded together).
    The embeddings, and so the loss, are the same as from one padded pass."""

    def __init__(
        self, model: Any, max_tokens: int, device: torch.device, forward_tokens: int
    ) -> None:
        self.model = model
        self.tokenizer = model.tokenizer
        self.max_tokens = max_tokens
        self.device = device
        self.forward_tokens = forward_tokens
        self.tokens = 0
        self.padded_tokens = 0

    def __call__(self, texts: list[str]) -> torch.Tensor:
        lengths = [
            len(ids)
            for ids in self.tokenizer(texts, truncation=True, max_length=self.max_tokens)[
                "input_ids"
            ]
        ]
        passes = micro_batches(lengths, self.forward_tokens, len(texts))
        parts = []
        for rows in passes:
            features = self.tokenizer(
                [texts[i] for i in rows],
                padding=True,
                truncation=True,
                max_length=self.max_tokens,
                return_tensors="pt",
            )
            mask = features["attention_mask"]
            self.tokens += int(mask.sum())
            self.padded_tokens += int(mask.numel())
            inputs = {k: v.to(self.device) for k, v in features.items()}
            parts.append(self.model(inputs)["sentence_embedding"])
        order = torch.tensor([i for rows in passes for i in rows], device=self.device)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order), device=self.device)
        out: torch.Tensor = torch.cat(parts)[inverse]
        return out


def contrastive_loss(
    queries: torch.Tensor, passages: torch.Tensor, scale: float
) -> tuple[torch.Tensor, float]:
    """InfoNCE over in-batch negatives; also the share of queries ranking their own
    passage first."""
    scores = F.normalize(queries.float(), dim=-1) @ F.normalize(passages.float(), dim=-1).T
    labels = torch.arange(scores.shape[0], device=scores.device)
    loss = F.cross_entropy(scores * scale, labels)
    accuracy = float((scores.argmax(dim=1) == labels).float().mean())
    return loss, accuracy


def _schedule(warmup: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def _save_checkpoint(
    folder: Path,
    peft_model: Any,
    optimizer: Any,
    scheduler: Any,
    state: _Progress,
    key: str,
    started: tuple[float, float],  # perf_counter() and process_time() at this run's start
) -> None:
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    peft_model.save_pretrained(str(tmp))
    progress = asdict(state)
    progress["earlier_wall_s"] += time.perf_counter() - started[0]
    progress["earlier_cpu_s"] += time.process_time() - started[1]
    torch.save(
        {
            "progress": progress,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": torch.get_rng_state(),
            "key": key,
        },
        tmp / STATE_FILE,
    )
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)  # a crash mid-save leaves the previous checkpoint whole


def _resume(folder: Path, peft_model: Any, optimizer: Any, scheduler: Any, key: str) -> _Progress:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    saved = torch.load(folder / STATE_FILE, weights_only=True)
    if saved["key"] != key:
        raise TrainError(
            f"the checkpoint in {folder} is of another run (data, base or settings differ); "
            "remove it or train into another --out"
        )
    set_peft_model_state_dict(peft_model, load_file(str(folder / "adapter_model.safetensors")))
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["rng"])
    return _Progress(**saved["progress"])


def _versions() -> dict[str, str]:
    out = {}
    for package in ("flotilla", "torch", "transformers", "peft", "sentence-transformers"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


def _progress_bar(disable: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=disable,
    )


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


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
    pairs: list[Pair] = read_pairs(pairs_path)
    data_sha = file_sha256(pairs_path)
    if device == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    torch_device = torch.device(device)
    seed_everything(config.train_seed)
    model = _load(base, torch_device)
    prompts = base.prompts if base.prompts is not None else prompts_of(model)
    base_sha = weights_sha256(base.path)
    peft_model = _with_lora(model, config)
    model.train()

    plan = [
        batches(pairs, config.train_batch_size, random.Random(config.train_seed + e))
        for e in range(config.train_epochs)
    ]
    total = sum(len(p) for p in plan)
    if config.train_max_steps:
        total = min(total, config.train_max_steps)
    if total == 0:
        raise TrainError(f"{pairs_path} yields no batch of two distinct pairs")
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.train_lr, weight_decay=0.0)
    warmup = math.ceil(config.train_warmup_ratio * total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(warmup, total))
    key = f"{data_sha}/{base_sha}/{config.model_dump_json()}"
    checkpoint = out / CHECKPOINT_DIR
    out.mkdir(parents=True, exist_ok=True)
    state = _Progress(losses=[], accuracies=[])
    if resume and (checkpoint / STATE_FILE).is_file():
        state = _resume(checkpoint, peft_model, optimizer, scheduler, key)
    assert state.losses is not None and state.accuracies is not None

    encode = _Encoder(model, config.train_max_seq_tokens, torch_device, base.forward_tokens)
    encode.tokens, encode.padded_tokens = state.tokens, state.padded_tokens
    autocast = _autocast_dtype(config, torch_device)
    every = config.train_checkpoint_steps
    stream = progress_stream if progress_stream is not None else sys.stderr
    on_terminal = stream.isatty()
    lines = (
        StepLines(
            f"LoRA r={config.lora_rank}",
            total,
            interval_s=progress_interval_s,
            start_step=state.step,
            stream=stream,
        )
        if show_progress and not on_terminal
        else None
    )
    with _progress_bar(not (show_progress and on_terminal)) as bar:
        task = bar.add_task(f"LoRA r={config.lora_rank}", total=total, loss="-", rate="")
        bar.update(task, completed=state.step)
        while state.epoch < config.train_epochs and state.step < total:
            for batch in plan[state.epoch][state.batch :]:
                if state.step >= total:
                    break
                step_start = (time.perf_counter(), time.process_time())
                queries = [prompts["query"] + pairs[i].query for i in batch]
                passages = [prompts["passage"] + pairs[i].positive for i in batch]
                with torch.autocast(
                    torch_device.type,
                    dtype=autocast or torch.bfloat16,
                    enabled=autocast is not None,
                ):
                    loss, accuracy = contrastive_loss(
                        encode(queries), encode(passages), config.train_scale
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                torch.nn.utils.clip_grad_norm_(trainable, 1.0)
                optimizer.step()
                scheduler.step()
                state.train_s += time.perf_counter() - step_start[0]
                state.train_cpu_s += time.process_time() - step_start[1]
                state.step += 1
                state.batch += 1
                state.pairs += len(batch)
                state.tokens, state.padded_tokens = encode.tokens, encode.padded_tokens
                value = loss.detach().item()
                state.losses.append(value)
                state.accuracies.append(accuracy)
                bar.update(
                    task,
                    advance=1,
                    loss=f"{value:.3f}",
                    rate=f"{state.tokens / state.train_s:,.0f} tok/s",
                )
                if lines is not None:
                    lines.update(state.step, value)
                if every and state.step % every == 0:
                    _save_checkpoint(
                        checkpoint, peft_model, optimizer, scheduler, state, key, started
                    )
            state.epoch, state.batch = state.epoch + 1, 0
            _save_checkpoint(checkpoint, peft_model, optimizer, scheduler, state, key, started)

    if lines is not None:
        lines.close()
    model.eval()
    peft_model.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)  # peft's model-card stub; the manifest says more
    shutil.rmtree(checkpoint, ignore_errors=True)
    wall_s = state.earlier_wall_s + time.perf_counter() - started[0]
    threads_used = torch.get_num_threads() if torch_device.type == "cpu" else 1
    device_name = _device_name(torch_device)
    tail = state.losses[-max(1, len(state.losses) // 10) :]
    ends = list(itertools.accumulate(len(p) for p in plan))
    per_epoch = [state.losses[end - len(p) : end] for end, p in zip(ends, plan, strict=True)]
    manifest = Manifest(
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        base=BaseInfo(base.name, str(base.path), base_sha),
        adapter=AdapterShape(
            config.lora_rank, config.lora_alpha, config.lora_dropout, list(config.lora_targets)
        ),
        training=TrainingRecord(
            pairs_file=str(pairs_path),
            pairs=len(pairs),
            data_sha256=data_sha,
            epochs=config.train_epochs,
            steps=state.step,
            batch_size=config.train_batch_size,
            lr=config.train_lr,
            warmup_ratio=config.train_warmup_ratio,
            max_seq_tokens=config.train_max_seq_tokens,
            scale=config.train_scale,
            seed=config.train_seed,
            autocast=str(autocast).removeprefix("torch.") if autocast else "float32",
            prompts=prompts,
        ),
        metrics=TrainMetrics(
            loss_first=state.losses[0] if state.losses else float("nan"),
            loss_last=_mean(tail),
            loss_per_epoch=[_mean(losses) for losses in per_epoch if losses],
            accuracy_last=_mean(state.accuracies[-len(tail) :]),
        ),
        measured=Measured(
            wall_s=wall_s,
            train_s=state.train_s,
            device=torch_device.type,
            device_name=device_name,
            threads=threads_used,
            cpu_process_s=state.earlier_cpu_s + time.process_time() - started[1],
            tokens=state.tokens,
            padded_tokens=state.padded_tokens,
            tokens_per_s=state.tokens / state.train_s if state.train_s else 0.0,
            train_cpu_s=state.train_cpu_s,
            tokens_per_core_s=state.tokens / state.train_cpu_s if state.train_cpu_s else 0.0,
            pairs_per_s=state.pairs / state.train_s if state.train_s else 0.0,
        ),
        cost=run_cost(
            device=torch_device.type,
            device_name=device_name,
            units=threads_used,
            wall_s=wall_s,
            prices=prices,
        ),
        versions=_versions(),
    )
    write_manifest(out, manifest)
    return manifest
