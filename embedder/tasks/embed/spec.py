"""An encoder's fleet entry and profile: the fields of embedding models, which rerank
models share (``embedder.tasks.rerank.spec``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from embedder.core.errors import InvalidRequest
from embedder.core.fleet import DeviceKind, ModelSpec, Profile, PromptUse

ENGINE = "encoder"  # the engine embedding and rerank models share (embed.engine)


class EncoderProfile(Profile):
    """How an encoder runs on one kind of device: the knobs the tuner sets."""

    latency_target_ms: float | None = Field(
        default=None,
        gt=0,
        description="Steer the wait for a fuller batch toward this p50 latency, between 0 "
        "and max_wait_ms, instead of always waiting max_wait_ms: one client gets near "
        "single-request latency, many get full batches. It also sizes what the worker takes: "
        "per batch what this device runs in half of it at its measured pace (never so "
        "little that the fixed cost per pass dominates, at most max_batch_tokens), so a "
        "slower device takes less. None keeps the fixed wait and max_batch_tokens.",
    )
    max_batch_tokens: int = Field(
        default=8192, gt=0, description="Estimated tokens the worker takes per batch."
    )
    forward_tokens: int = Field(
        default=2048,
        gt=0,
        description="Padded tokens per forward pass; small on CPU (cache), large on GPU.",
    )
    forward_max_sequences: int = Field(default=64, gt=0, description="Sequences per forward pass.")
    max_resident_adapters: int = Field(
        default=8,
        gt=0,
        description="LoRA adapters kept loaded; the least recently used one is unloaded "
        "when another is needed. Each costs its weights' memory (a few MB for rank 16).",
    )
    mix_adapters: bool = Field(
        default=True,
        description="Requests for different adapters of a model share one batch (each row "
        "runs its own adapter) instead of waiting for a batch of their own: fuller batches "
        "when traffic spreads over many adapters, at a per-pass cost (bench.adapters).",
    )


class EncoderSpec(ModelSpec):
    """What embedding and rerank models have: pooling, normalizing and prompts."""

    profile_type: ClassVar[type[Profile]] = EncoderProfile

    pooling: Literal["model", "mean", "cls", "last"] = Field(
        default="model", description="'model' keeps the pooling the model folder configures."
    )
    normalize: bool = True
    prompts: dict[str, str] = Field(
        default_factory=dict,
        description="Named prefixes the model was trained with (e5: query -> 'query: '); a "
        "request picks one by name (TEI's prompt_name) or by use (input_type).",
    )
    default_prompt: str | None = Field(
        default=None, description="The prompt of requests that name neither prompt nor use."
    )
    query_prompt: str | None = Field(
        default=None,
        description="The prompt of queries: input_type query, search queries, rerank queries.",
    )
    document_prompt: str | None = Field(
        default=None,
        description="The prompt of documents: input_type document or passage, ingested "
        "documents, the documents of a rerank.",
    )
    profiles: dict[DeviceKind, EncoderProfile] = Field(default_factory=dict)  # type: ignore[assignment]

    @model_validator(mode="after")
    def _prompts_exist(self) -> EncoderSpec:
        for field in ("default_prompt", "query_prompt", "document_prompt"):
            name = getattr(self, field)
            if name is not None and name not in self.prompts:
                known = ", ".join(sorted(self.prompts)) or "none"
                raise ValueError(f"{field} {name!r} is not one of the prompts ({known})")
        return self

    def profile(self, device: DeviceKind) -> EncoderProfile:
        return self.profiles.get(device) or self.profiles.get("cpu") or EncoderProfile()

    def prompt_prefix(self, prompt_name: str | None = None, use: PromptUse | None = None) -> str:
        """The text to put before each input: the named prompt, else the use's prompt (none
        when the model has none for that use), else the default prompt. A model without
        prompts ignores the use; naming a prompt it lacks is an InvalidRequest (422)."""
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                known = ", ".join(repr(p) for p in sorted(self.prompts))
                raise InvalidRequest(
                    f"model {self.name!r} has no prompt {prompt_name!r}; "
                    + (f"its prompts: {known}" if known else "it defines no prompts")
                )
            return self.prompts[prompt_name]
        chosen = {"query": self.query_prompt, "document": self.document_prompt}.get(
            use or "", self.default_prompt
        )
        return self.prompts[chosen] if chosen is not None else ""


class EmbedSpec(EncoderSpec):
    """An embedding model: texts in, vectors out."""

    task: Literal["embed"] = "embed"
