"""A generation model's fleet entry and profile."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from embedder.core.fleet import DeviceKind, ModelSpec, Profile


class GenerateProfile(Profile):
    """How a causal LM runs on one kind of device: its KV budget and prefill steps."""

    kv_tokens: int = Field(
        default=8192,
        gt=0,
        description="The KV budget: tokens of every running sequence together, each counting "
        "its prompt plus the new tokens it may still make, so a running sequence never runs "
        "out of room.",
    )
    prefill_chunk_tokens: int = Field(
        default=128,
        gt=0,
        description="A prompt is prefilled this many tokens per step, between the decode "
        "steps of the running sequences. Smaller: running streams stall less while a long "
        "prompt joins; larger: the prompt's first token comes sooner.",
    )


class GenerateSpec(ModelSpec):
    """A causal LM served with continuous batching; ``max_tokens`` is its context window
    (prompt plus generated tokens)."""

    profile_type: ClassVar[type[Profile]] = GenerateProfile

    task: Literal["generate"] = "generate"
    chat_template: str | None = Field(
        default=None,
        description="The Jinja chat template that turns messages into a prompt; None takes "
        "the one in the model's tokenizer config.",
    )
    max_new_tokens: int = Field(
        default=256,
        gt=0,
        description="Tokens a request gets when it sets no max_tokens. Each running request "
        "reserves its prompt plus these in the KV budget (kv_tokens): larger defaults admit "
        "fewer requests at once.",
    )
    profiles: dict[DeviceKind, GenerateProfile] = Field(default_factory=dict)  # type: ignore[assignment]

    def profile(self, device: DeviceKind) -> GenerateProfile:
        return self.profiles.get(device) or self.profiles.get("cpu") or GenerateProfile()
