"""``flotilla_adapter.json``: what an adapter folder holds beside peft's own files
(``adapter_config.json``, ``adapter_model.safetensors``): which base it was trained on,
from which data, with which knobs, how it went, and what it cost.

The base is named twice: by its fleet name when it came from the fleet, and by a hash
of its weight files, which is what an adapter really depends on (a fleet name can point
at new weights tomorrow).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lora.cost import Cost
from lora.negatives import MiningStats

MANIFEST_NAME = "flotilla_adapter.json"
FORMAT = 1
WEIGHT_SUFFIXES = {".safetensors", ".bin", ".pt", ".pth"}
SKIPPED_DIRS = {"onnx", "openvino"}  # other runtimes' copies of the same weights


@dataclass(frozen=True, slots=True)
class BaseInfo:
    name: str | None  # fleet name, when --base named one
    path: str
    weights_sha256: str


@dataclass(frozen=True, slots=True)
class AdapterShape:
    rank: int
    alpha: int
    dropout: float
    targets: list[str]


@dataclass(frozen=True, slots=True)
class TrainingRecord:
    pairs_file: str
    pairs: int
    data_sha256: str
    epochs: int
    steps: int
    batch_size: int
    lr: float
    warmup_ratio: float
    max_seq_tokens: int
    scale: float
    seed: int
    autocast: str
    prompts: dict[str, str]  # the base model's query/passage prompts, applied in training
    loss: str  # TrainConfig.train_loss: "mnrl", "cached_mnrl", "gist" or "cached_gist"
    mini_batch_size: int  # of the cached loss
    gradient_checkpointing: bool = False
    attention_dropout: float | None = None  # the base's, in training (None: an older run)
    # the mined hard negatives: how many per query, from what, and what the filters
    # dropped; None when the run had in-batch negatives only
    negatives: MiningStats | None = None
    batches: str = "mixed"  # TrainConfig.train_batches: each batch of every law, or of one


@dataclass(frozen=True, slots=True)
class TrainMetrics:
    loss_first: float  # the first step's loss: about ln(batch size) for an untrained task
    loss_last: float  # mean over the last tenth of the steps
    loss_per_epoch: list[float]


@dataclass(frozen=True, slots=True)
class Measured:
    wall_s: float  # the whole run: load, train, save
    train_s: float  # the training loop alone
    device: str
    device_name: str
    threads: int  # torch CPU threads
    cpu_process_s: float  # CPU time the process consumed (all threads)
    tokens: int  # real tokens through forward and backward, padding excluded
    padded_tokens: int
    tokens_per_s: float  # tokens / train_s
    train_cpu_s: float  # CPU time of the training loop, all threads
    # tokens / train_cpu_s: on a machine shared with other jobs, where wall time stretches
    # with the contention, a steadier measure of the work a core does
    tokens_per_core_s: float
    pairs_per_s: float
    # the process's resident-memory high-water mark (getrusage), loading included; in a
    # process that ran other work first, theirs too
    peak_rss_bytes: int
    peak_device_bytes: int | None  # torch.cuda.max_memory_allocated on a GPU


@dataclass(frozen=True, slots=True)
class Manifest:
    created: str
    base: BaseInfo
    adapter: AdapterShape
    training: TrainingRecord
    metrics: TrainMetrics
    measured: Measured
    cost: Cost
    versions: dict[str, str] = field(default_factory=dict)
    format: int = FORMAT


def weights_sha256(folder: Path) -> str:
    """One hash over a model folder's weight files (names and contents, sorted)."""
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix in WEIGHT_SUFFIXES
        and not SKIPPED_DIRS & set(p.relative_to(folder).parts[:-1])
    )
    for path in files:
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path, manifest: Manifest) -> Path:
    path = folder / MANIFEST_NAME
    path.write_text(json.dumps(asdict(manifest), indent=2, ensure_ascii=False) + "\n")
    return path


def read_manifest(folder: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    return loaded
