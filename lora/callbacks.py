"""What flotilla measures inside sentence-transformers' trainer: the tokens each batch
carries (counted at the loss), the loss of each step, the wall and CPU
time, and the plain progress lines off a terminal. The counts travel with each
checkpoint (``flotilla_state.json``), so a resumed run reports the whole run."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformerTrainer
from transformers import TrainerCallback

from lora.progress import StepLines

STATE_FILE = "flotilla_state.json"
RUN_KEY_FILE = "flotilla_run_key.txt"


@dataclass(slots=True)
class Counts:
    """What the run has done so far; saved with each checkpoint."""

    tokens: int = 0  # real tokens, padding excluded, through forward and backward
    padded_tokens: int = 0
    pairs: int = 0
    train_s: float = 0.0  # wall time of the training loop
    train_cpu_s: float = 0.0  # CPU time of the training loop, all threads
    earlier_wall_s: float = 0.0  # wall and CPU time of the whole runs before a resume,
    earlier_cpu_s: float = 0.0  # up to their last checkpoint
    losses: list[float] = field(default_factory=list)
    loss_epochs: list[int] = field(default_factory=list)  # the epoch of each loss


class CountingTrainer(SentenceTransformerTrainer):
    """The trainer, counting the real and padded tokens of each batch it trains on (at
    the loss, so batches a data loader fetched ahead are counted once, when used)."""

    counts: Counts

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        if model.training:
            rows = 0
            for key, value in inputs.items():
                if key.endswith("_attention_mask"):
                    self.counts.tokens += int(value.sum())
                    self.counts.padded_tokens += int(value.numel())
                    rows = int(value.shape[0])
            self.counts.pairs += rows
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class Measure(TrainerCallback):
    """Losses, times and progress lines; the counts into and out of checkpoints."""

    def __init__(
        self,
        counts: Counts,
        *,
        lines: StepLines | None,
        started: tuple[float, float],  # perf_counter() and process_time() at the run's start
        run_key: str,
    ) -> None:
        self.counts = counts
        self.lines = lines
        self.started = started
        self.run_key = run_key
        self._step_start = (0.0, 0.0)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._step_start = (time.perf_counter(), time.process_time())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.counts.train_s += time.perf_counter() - self._step_start[0]
        self.counts.train_cpu_s += time.process_time() - self._step_start[1]

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any
    ) -> None:
        if not logs or "loss" not in logs:
            return
        loss = float(logs["loss"])
        self.counts.losses.append(loss)
        self.counts.loss_epochs.append(max(0, math.ceil(state.epoch or 0) - 1))
        if self.lines is not None:
            self.lines.update(state.global_step, loss)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        saved = asdict(self.counts)
        saved["earlier_wall_s"] += time.perf_counter() - self.started[0]
        saved["earlier_cpu_s"] += time.process_time() - self.started[1]
        (folder / STATE_FILE).write_text(json.dumps(saved))
        (folder / RUN_KEY_FILE).write_text(self.run_key)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.lines is not None:
            self.lines.close()


def load_counts(checkpoint: Path) -> Counts:
    return Counts(**json.loads((checkpoint / STATE_FILE).read_text()))
