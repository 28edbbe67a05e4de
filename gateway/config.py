"""What the gateway needs to know of the settings, as one small immutable object.

The gateway's own settings are ``GatewayLimits``, which ``flotilla.settings`` holds as
its ``gateway`` section; ``GatewayConfig`` adds what the gateway shares with other
parts: the OCR limits it checks before queueing, the token estimate and the documents
routes' batch. The wiring (``flotilla.wiring.gateway_config``) passes those sections
in; the gateway itself never imports ``flotilla``, so it stays a layer below the
commands and can be wired by anything (tests, benchmarks, another CLI). Each message
that names a limit also names the flag that changes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from embedder.tasks.ocr.api import OcrLimits


class GatewayLimits(BaseModel):
    """Who may call, and how much and how long a request may take; each field a setting."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_keys: tuple[str, ...] = Field(
        default=(),
        description="Accepted bearer tokens, comma-separated; empty leaves the API open.",
    )
    admin_keys: tuple[str, ...] = Field(
        default=(),
        description="Bearer tokens of the admin API (/admin/models: add and remove models "
        "while serving), comma-separated; empty turns the admin API off. Client keys "
        "(--api-keys) are never accepted there.",
    )
    request_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Deadline of a request from arrival; past it the client gets 504 and the "
        "worker skips the job.",
    )
    max_body_bytes: int = Field(
        default=4_000_000, gt=0, description="Largest request body accepted (413 above)."
    )
    body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest wait for the next piece of a request body; past it the client "
        "gets 408 and the connection closes. Lower frees stalled connections sooner, higher "
        "tolerates slower uploads.",
    )
    max_inflight_tokens: int = Field(
        default=65_536,
        gt=0,
        description="Estimated tokens admitted per model at once; beyond it requests get 429 "
        "with Retry-After. Higher absorbs bursts, lower bounds queueing latency.",
    )

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

    @model_validator(mode="after")
    def _admin_keys_apart(self) -> GatewayLimits:
        # A key in both would let every client that holds it change the fleet.
        if set(self.api_keys) & set(self.admin_keys):
            raise ValueError(
                "a key is in both --api-keys and --admin-keys: give the admin API keys of its own"
            )
        return self


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    version: str  # shown in the OpenAPI document
    bytes_per_token: float  # for estimating a body's tokens without parsing it
    max_documents_per_request: int  # the documents routes' batches
    limits: GatewayLimits = field(default_factory=GatewayLimits)
    ocr: OcrLimits = field(default_factory=OcrLimits)  # /v1/ocr: pages and document size
