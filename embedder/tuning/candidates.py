"""What the tuner tries: a candidate is one setting of the tuned profile fields, and
the plan says which settings each stage of the search tries."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from embedder.core.fleet import DeviceKind, Precision
from embedder.tasks.embed.runtimes import PRECISIONS, RUNTIMES
from embedder.tasks.embed.spec import EncoderProfile


@dataclass(frozen=True, slots=True)
class Candidate:
    runtime: str
    dtype: Precision
    threads: int
    forward_tokens: int
    forward_max_sequences: int
    max_batch_tokens: int

    @staticmethod
    def of(profile: EncoderProfile, threads: int) -> Candidate:
        """The fleet's own profile as a candidate, with ``threads`` when it says 0."""
        return Candidate(
            profile.runtime,
            profile.dtype,
            profile.threads or threads,
            profile.forward_tokens,
            profile.forward_max_sequences,
            profile.max_batch_tokens,
        )

    def fields(self) -> dict[str, Any]:
        return asdict(self)

    def but(self, **changes: Any) -> Candidate:
        return replace(self, **changes)

    @property
    def load_key(self) -> tuple[object, ...]:
        """What a runtime is loaded with: all but the batch budget, which only the worker
        (here, the search) reads."""
        return (self.runtime, self.dtype, self.threads, self.forward_tokens,
                self.forward_max_sequences)  # fmt: skip

    @property
    def label(self) -> str:
        return (
            f"{self.runtime}/{self.dtype} {self.forward_tokens}x{self.forward_max_sequences} "
            f"batch {self.max_batch_tokens} t{self.threads}"
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """The search's budget. Stages: runtime x precision at the fleet's shape; then, for
    the best ``finalists``, each pass shape; then the batch budget; then threads. Each
    timing is the best of ``repeats`` rounds, candidates interleaved within a round."""

    texts: int = 240
    repeats: int = 3
    finalists: int = 2
    shapes: tuple[tuple[int, int], ...] = (
        (1024, 16),
        (1024, 32),
        (2048, 32),
        (2048, 64),
        (4096, 64),
        (4096, 128),
    )
    batch_tokens: tuple[int, ...] = (2048, 4096, 8192, 16384)
    threads: tuple[int, ...] = ()  # () : 1, half and all of the usable cores
    # Within this share of the fastest, the smaller batch budget and fewer threads win:
    # they cost latency and cores, and such a gap is within a shared machine's noise.
    tie: float = 0.03
    quick: bool = False  # no threads stage: the tune at load or in the background


# Seconds to minutes: the best precision, then two pass shapes and the batch budgets from
# half to twice the fleet's usual 8192 (threads stay what serving runs with). 16384 is in
# because the full search chose it for all-MiniLM-L6-v2 on a 2-core Xeon (+11% over 8192),
# and without it a first start served 0.86x what the full tune's profile did.
QUICK = Plan(
    texts=64,
    repeats=2,
    finalists=1,
    shapes=((1024, 16), (2048, 64)),
    batch_tokens=(4096, 8192, 16384),
    quick=True,
)
# A GPU runs passes of tens of thousands of tokens in milliseconds: its shapes and batch
# budgets reach far past a CPU's, and it needs more texts to fill its largest budget
# several times over. torch attends with flash-attn when installed, else SDPA.
CUDA = Plan(
    texts=2000,
    shapes=((4096, 64), (8192, 128), (16384, 256), (32768, 256), (32768, 512)),
    batch_tokens=(8192, 16384, 32768, 65536, 131072),
)
# QUICK's budget over the GPU's search space, on enough texts to fill its passes.
CUDA_QUICK = replace(
    CUDA,
    texts=512,
    repeats=QUICK.repeats,
    finalists=QUICK.finalists,
    shapes=((8192, 128), (32768, 512)),
    batch_tokens=(32768, 65536),
    quick=QUICK.quick,
)
PLANS: dict[DeviceKind, tuple[Plan, Plan]] = {"cpu": (Plan(), QUICK), "cuda": (CUDA, CUDA_QUICK)}


def plan_for(device: DeviceKind, *, quick: bool = False) -> Plan:
    """The search's plan for this kind of device: the full one, or the quick one."""
    full, short = PLANS[device]
    return short if quick else full


def precisions(device: DeviceKind) -> list[tuple[str, Precision]]:
    """Every registered runtime x the precisions it offers on this kind of device."""
    return [
        (runtime, dtype)
        for runtime in RUNTIMES
        for dtype in PRECISIONS.get(runtime, {}).get(device, ())
    ]


def thread_counts(plan: Plan, cores: int) -> list[int]:
    return sorted(set(plan.threads) or {1, max(1, cores // 2), cores})
