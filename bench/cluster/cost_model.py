"""The cost model of the cluster simulation: what one worker's batch costs.

    batch_s = fixed_s + per_token_s * padded_tokens

where ``padded_tokens`` counts what the runtime really runs: inputs sorted by
length and cut into passes of at most ``forward_tokens`` padded tokens
(``micro_batches``). Capacity per batch is the profile's ``max_batch_tokens`` and
``max_batch_requests``. ``load_cost`` reads the fit measured on the real
runtime (``python -m bench.cluster.calibrate`` writes it to
``bench/results/cluster_calibration.json``).

Without that file the simulation uses ``FALLBACK``: the same fit, measured once
on the machine named there. ``gpu_like`` scales a fit into GPU-like numbers
with the fleet's cuda profile; ``gpu_fixed`` is a GPU whose fixed cost per pass
dominates at the batch sizes it runs. Both are HYPOTHETICAL, not measured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench import report

MODEL = "all-minilm-l6-v2"
RESULT = "cluster_calibration.json"
# GPU-like numbers (HYPOTHETICAL): the per-token cost divided by this, the fixed
# per-batch cost (Python, kernel launches, copies) kept; the cuda profile's budgets.
GPU_PER_TOKEN_DIVISOR = 100.0
GPU_FIXED_FACTOR = 1.0
# The fixed-cost GPU (HYPOTHETICAL): batches held small enough that one pass's fixed cost
# is most of its time (8 short requests: about 0.6 ms of tokens against 6.7 ms fixed), so
# that a 2-core host path can feed 8 such workers at a device scale of ~50.
GPU_FIXED_BATCH_TOKENS = 512
GPU_FIXED_BATCH_REQUESTS = 8


@dataclass(frozen=True, slots=True)
class CostModel:
    """What one worker's batch costs, and the batching limits it runs under."""

    label: str
    source: str  # "measured" | "fallback" | "hypothetical"
    fixed_s: float
    per_token_s: float
    max_batch_tokens: int
    max_batch_requests: int
    max_wait_s: float
    forward_tokens: int
    forward_max_sequences: int
    scale: float = 1.0  # how much slower than measured (``emulation.device_cost``)

    def batch_s(self, lengths: Sequence[int]) -> float:
        return self.fixed_s + self.per_token_s * padded_tokens(
            lengths, self.forward_tokens, self.forward_max_sequences
        )

    def full_batch_s(self) -> float:
        """A batch of ``max_batch_tokens`` with no padding: the cost-model's time unit."""
        return self.fixed_s + self.per_token_s * self.max_batch_tokens


def padded_tokens(lengths: Sequence[int], max_tokens: int, max_sequences: int) -> int:
    """Tokens the runtime runs for inputs of these lengths, padding included: the
    ``micro_batches`` rule (sorted ascending; a pass ends when one more input at the
    current width would exceed ``max_tokens`` or the pass holds ``max_sequences``)."""
    total = count = width = 0
    for n in sorted(lengths):
        if count and ((count + 1) * n > max_tokens or count >= max_sequences):
            total += count * width
            count = 0
        count += 1
        width = n
    return total + count * width


# Measured with `python -m bench.cluster.calibrate --threads 1 --clock cpu --dtype bfloat16`
# on the build machine (AMD EPYC, 2 cores, avx512_bf16, torch 2.15, a busy shared host):
# r² 0.988 over 32 batches of 1-404 inputs, worst relative error 21%.
FALLBACK = CostModel(
    label="cpu fallback (fit measured on a 2-core AMD EPYC: 1 thread, bf16 autocast, cpu clock)",
    source="fallback",
    fixed_s=0.00669,
    per_token_s=0.0001586,
    max_batch_tokens=8192,
    max_batch_requests=64,
    max_wait_s=0.002,
    forward_tokens=2048,
    forward_max_sequences=64,
)


def result_path() -> Path:
    return report.RESULTS / RESULT


def load_cost(path: Path | None = None) -> CostModel:
    """The measured fit from ``path`` (default: the calibration result), else FALLBACK."""
    path = path or result_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        fit, profile = data["fit"], data["profile"]
        return CostModel(
            label=f"cpu measured ({data['machine'].get('cpu', '?')}, "
            f"{data['machine'].get('threads', '?')} threads, {data['dtype']}, "
            f"{data['args'].get('clock', 'wall')} clock)",
            source="measured",
            fixed_s=float(fit["fixed_s"]),
            per_token_s=float(fit["per_token_s"]),
            max_batch_tokens=int(profile["max_batch_tokens"]),
            max_batch_requests=int(profile["max_batch_requests"]),
            max_wait_s=float(profile["max_wait_ms"]) / 1e3,
            forward_tokens=int(profile["forward_tokens"]),
            forward_max_sequences=int(profile["forward_max_sequences"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return FALLBACK


def gpu_like(
    base: CostModel,
    per_token_divisor: float = GPU_PER_TOKEN_DIVISOR,
    fixed_factor: float = GPU_FIXED_FACTOR,
) -> CostModel:
    """HYPOTHETICAL GPU-like numbers: ``base`` scaled, with the fleet's cuda budgets.
    Not measured: a GPU runs tokens ~100x faster, while the per-batch fixed cost
    (Python, tokenizer hand-off, kernel launches) stays of the same order."""
    from embedder.core.fleet import entry_as
    from embedder.tasks.embed.spec import EncoderSpec
    from embedder.tasks.fleet import load_fleet

    cuda = entry_as(load_fleet().get(MODEL), EncoderSpec).profile("cuda")
    return replace(
        base,
        label=f"gpu-like HYPOTHETICAL (per-token cost / {per_token_divisor:g}, fixed cost x "
        f"{fixed_factor:g}, cuda profile budgets; from {base.source} cpu fit)",
        source="hypothetical",
        fixed_s=base.fixed_s * fixed_factor,
        per_token_s=base.per_token_s / per_token_divisor,
        max_batch_tokens=cuda.max_batch_tokens,
        max_batch_requests=cuda.max_batch_requests,
        max_wait_s=cuda.max_wait_ms / 1e3,
        forward_tokens=cuda.forward_tokens,
        forward_max_sequences=cuda.forward_max_sequences,
    )


def gpu_fixed(base: CostModel) -> CostModel:
    """HYPOTHETICAL: a GPU where most of a batch's time is the fixed cost of the pass
    (launches, copies, Python), as for a small encoder on a real GPU at the batch sizes it
    sees: ``base``'s per-token cost / ``GPU_PER_TOKEN_DIVISOR``, its fixed cost kept, and
    a budget of ``GPU_FIXED_BATCH_REQUESTS`` requests."""
    return replace(
        base,
        label=f"gpu-fixed HYPOTHETICAL (fixed cost {1e3 * base.fixed_s:.3g} ms a pass, "
        f"per-token cost / {GPU_PER_TOKEN_DIVISOR:g}, at most {GPU_FIXED_BATCH_REQUESTS} "
        f"requests / {GPU_FIXED_BATCH_TOKENS} tokens a batch; from {base.source} cpu fit)",
        source="hypothetical",
        per_token_s=base.per_token_s / GPU_PER_TOKEN_DIVISOR,
        max_batch_tokens=GPU_FIXED_BATCH_TOKENS,
        max_batch_requests=GPU_FIXED_BATCH_REQUESTS,
        forward_tokens=GPU_FIXED_BATCH_TOKENS,
        forward_max_sequences=GPU_FIXED_BATCH_REQUESTS,
    )
