"""The knobs of a LoRA run and the prices its cost is counted in.

Both are plain pydantic models: ``flotilla.settings.LoraSettings`` mixes them into the
settings object, which makes every field a flag (``--lora-rank``) and an environment
variable (``FLOTILLA_LORA_RANK``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import NoDecode

Batches = Literal["mixed", "law"]  # what a training batch is drawn from (train_batches)


class TrainConfig(BaseModel):
    lora_rank: int = Field(
        default=16, gt=0, description="LoRA rank r: capacity of the update against its size."
    )
    lora_alpha: int = Field(
        default=32, gt=0, description="LoRA alpha; the update is scaled by alpha / rank."
    )
    lora_dropout: float = Field(
        default=0.1, ge=0, lt=1, description="Dropout on the LoRA path during training."
    )
    lora_targets: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["query", "key", "value", "dense"],
        description="Module names that get adapters, comma-separated. For BERT-style "
        "encoders 'query,key,value,dense' covers attention and the feed-forward layers; "
        "'query,value' trains a quarter of the parameters.",
    )
    train_epochs: int = Field(default=1, gt=0, description="Passes over the training pairs.")
    train_batch_size: int = Field(
        default=32,
        ge=2,
        description="Pairs per step; every other pair's passage is a negative, so larger "
        "batches give a harder task and more memory per step.",
    )
    train_lr: float = Field(
        default=1e-4,
        gt=0,
        description="Peak learning rate (AdamW). 2e-4 at scale 20 fit the training laws "
        "without gain on held-out ones; 1e-4 at scale 100 lifted them (docs/results/lora.md).",
    )
    train_warmup_ratio: float = Field(
        default=0.1, ge=0, lt=1, description="Share of steps with a linear warm-up to the peak."
    )
    train_max_seq_tokens: int = Field(
        default=256,
        gt=0,
        description="Longest input in training, in model tokens; longer passages are cut. "
        "Cost grows with it; keep it at or under what serving allows.",
    )
    train_scale: float = Field(
        default=100.0,
        gt=0,
        description="Inverse temperature of the contrastive loss (cosine x scale). 100 is "
        "e5's own training temperature (0.01); sentence-transformers' "
        "MultipleNegativesRankingLoss uses 20.",
    )
    train_loss: Literal["mnrl", "cached_mnrl", "gist", "cached_gist"] = Field(
        default="mnrl",
        description="The contrastive loss over in-batch negatives: 'mnrl' "
        "(MultipleNegativesRankingLoss) embeds a whole batch with gradients at once; "
        "'cached_mnrl' (GradCache) embeds it in mini-batches and holds the memory of one, "
        "for large batches at small memory, at about a third more compute. 'gist' "
        "(GISTEmbedLoss) and 'cached_gist' guide either by the frozen base: a negative it "
        "scores above the pair's positive is dropped as a false negative, and queries and "
        "passages are also contrasted among themselves; one more pass of the base a batch.",
    )
    train_mini_batch_size: int = Field(
        default=8,
        ge=1,
        description="Texts per embedding mini-batch of the cached losses (also cut at the "
        "profile's forward_tokens); smaller holds less memory, larger runs faster.",
    )
    train_batches: Batches = Field(
        default="mixed",
        description="What a batch is drawn from: 'mixed' takes pairs of every law, so most "
        "in-batch negatives are other laws' sections; 'law' draws each batch from one law "
        "(the pair's 'law'), so they are sections of the same law, the look-alikes "
        "retrieval within a law must tell apart, at no mining cost.",
    )
    train_negatives: int = Field(
        default=0,
        ge=0,
        description="Hard negatives mined per query, fed to the loss beside the in-batch "
        "ones (0: in-batch only). Each adds a passage to every row: more signal per step, "
        "about (2 + N) / 2 times the compute and memory of a step.",
    )
    train_negatives_from: Literal["model", "bm25", "both"] = Field(
        default="model",
        description="What ranks the candidates: 'model' (the base, with serving's prompts: "
        "the passages it confuses), 'bm25' (lexical look-alikes, no model pass), or 'both' "
        "(taken in turn).",
    )
    train_negatives_margin: float = Field(
        default=0.01,
        ge=0,
        lt=1,
        description="A candidate scoring above the positive's score less this share of it "
        "is taken for a false negative and dropped; larger drops more, hard negatives "
        "included. e5's cosines sit close together: at 0.05 (NV-Retriever's TopK-PercPos) "
        "most BGB headings kept none, at 0.01 nearly all kept 3 (docs/results/lora.md).",
    )
    train_negatives_candidates: int = Field(
        default=30,
        gt=0,
        description="Top candidates each ranker offers per query before the filters; more "
        "finds negatives for more queries, at more mining time.",
    )
    train_attention_dropout: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="The base's dropout on attention weights while training (e5's own "
        "config says 0.1). Above 0 torch's fused attention cannot run: the weights "
        "are materialized and masked. At 0 a batch of 32 x 256 tokens ran forward and "
        "backward in 3.3 s instead of 13.1 on 2 EPYC cores (docs/results/lora.md); LoRA's "
        "own dropout still regularizes.",
    )
    train_activations: Literal["hold", "recompute"] = Field(
        default="hold",
        description="'recompute' is gradient checkpointing: each layer's activations are "
        "recomputed in the backward pass instead of held. The same result at far less "
        "memory, for about half again the compute at attention dropout 0 "
        "(docs/results/lora.md: 3.4 against 6.4 GiB).",
    )
    train_seed: int = Field(default=0, description="Seeds weights, shuffling and dropout.")
    train_autocast: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="Mixed precision of forward and backward: 'auto' is bf16 on CUDA and fp32 "
        "on CPU; bf16 on a CPU with AVX512-BF16 is faster and a little less exact.",
    )
    train_checkpoint_steps: int = Field(
        default=0,
        ge=0,
        description="Save a resumable checkpoint every N steps; 0 saves at the end of each "
        "epoch only.",
    )
    train_max_steps: int = Field(
        default=0,
        ge=0,
        description="Run N steps, passing over the pairs again as often as that takes "
        "(0: --train-epochs passes).",
    )

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _split_targets(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value


class Prices(BaseModel):
    """List prices per device-hour, in US dollars. Defaults are AWS on-demand prices in
    us-east-1 (2025) for the smallest instance holding one such device, divided by the
    devices in it; set your own (spot, reserved, another cloud) with these flags."""

    price_cpu_core_hour_usd: float = Field(
        default=0.05132,
        ge=0,
        description="One CPU core for an hour: c7a.medium (1 vCPU = 1 physical AMD core), "
        "$0.05132/h.",
    )
    price_l4_hour_usd: float = Field(
        default=0.8048, ge=0, description="One NVIDIA L4 for an hour: g6.xlarge, $0.8048/h."
    )
    price_a10_hour_usd: float = Field(
        default=1.006, ge=0, description="One NVIDIA A10G for an hour: g5.xlarge, $1.006/h."
    )
    price_h100_hour_usd: float = Field(
        default=6.88,
        ge=0,
        description="One NVIDIA H100 for an hour: p5.48xlarge ($55.04/h since the June 2025 "
        "price cut) / 8 GPUs.",
    )
