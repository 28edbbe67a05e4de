"""What both halves of the JetStream work queue must agree on: the names of its streams,
subjects, consumers and bucket, and their limits. Imports no nats, so the settings can
hold it (as their ``jetstream`` section, each field a setting named by its alias)
without loading the client in a process that never uses it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

CONSUMER_PREFIX = "workers"


@dataclass(frozen=True, slots=True, order=True)
class Lane:
    """One model's queue of the requests whose time budget falls in one band of
    ``deadline_lanes_ms``: index 0 the most urgent. The last lane is the model's own
    subject and consumer (the only one without lanes)."""

    model: str
    index: int


class JetStreamConfig(BaseModel):
    """The stream's and consumers' settings; the dead-letter stream, its subjects and
    the liveness bucket are named after the stream and the subject prefix."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True)

    stream: str = Field(
        default="FLOTILLA_JOBS",
        validation_alias="nats_stream",
        description="Work-queue stream of requests; its dead letters go to <stream>_DEAD and "
        "worker liveness to the KV bucket <stream>_workers.",
    )
    subject_prefix: str = Field(
        default="flotilla.jobs",
        validation_alias="nats_subject_prefix",
        description="Requests are published on <prefix>.<model>: a worker pulls only the "
        "models it hosts, through one durable consumer per model its peers share.",
    )
    storage: Literal["memory", "file"] = Field(
        default="file",
        validation_alias="nats_storage",
        description="Where the stream keeps requests: 'file' survives a server restart and "
        "costs a disk write per request; 'memory' is faster and loses the queued requests "
        "when the server restarts (gateways publish again those they still wait for).",
    )
    ack_wait_s: float = Field(
        default=10.0,
        gt=0,
        validation_alias="nats_ack_wait_s",
        description="How long a request a worker holds without news goes unacked before it "
        "is given to another worker. Lower recovers a dead worker's requests sooner; workers "
        "send in-progress acks every third of it, so long jobs are not run twice.",
    )
    max_ack_pending: int = Field(
        default=1_024,
        gt=0,
        validation_alias="nats_max_ack_pending",
        description="Most requests of one model held by all its workers at once (fetched, not "
        "yet acked); past it the server hands out nothing more. Higher fills more workers' "
        "budgets; lower bounds what a dead worker strands until --nats-ack-wait-s.",
    )
    max_deliver: int = Field(
        default=5,
        gt=0,
        validation_alias="nats_max_deliver",
        description="Deliveries of one request before it is dead-lettered (<stream>_DEAD, with "
        "the reason) and its client gets 502. Counts crashes, stalls past the ack wait and "
        "hand-backs (over a worker's budget, too late for a slow worker, caught by a busy "
        "one's open fetch): higher tolerates more, lower stops a request that kills workers "
        "sooner.",
    )
    publish_timeout_s: float = Field(
        default=2.0,
        gt=0,
        validation_alias="nats_publish_timeout_s",
        description="How long a gateway waits for the stream to confirm a request before "
        "answering 503 with Retry-After (the broker is down or stalled). Higher rides out a "
        "slower broker; lower tells clients sooner. A request the broker cannot be reached "
        "for at all is refused at once.",
    )
    failover_s: float = Field(
        default=10.0,
        ge=0,
        validation_alias="nats_failover_s",
        description="How long a gateway keeps offering a request to a stream that takes "
        "none for the moment (a replicated stream electing its next leader after a server "
        "is lost takes seconds; a stream being made again) before answering 503 with "
        "Retry-After; the request's own deadline bounds it too. 0 refuses at once.",
    )
    nak_delay_ms: int = Field(
        default=20,
        ge=0,
        validation_alias="nats_nak_delay_ms",
        description="Delay before a request a worker handed back over its token budget is "
        "offered again. Lower gives it sooner to a free worker; higher keeps the same busy "
        "worker from taking it straight back. Requests a worker cannot finish in time, or "
        "that a busy worker's open fetch caught, go back without delay.",
    )
    max_age_s: float = Field(
        default=3_600.0,
        gt=0,
        validation_alias="nats_max_age_s",
        description="Longest a request or dead letter is kept in its stream; requests expire "
        "at their own deadline long before, so this only bounds what an outage leaves.",
    )
    max_bytes: int = Field(
        default=1 << 30,
        gt=0,
        validation_alias="nats_max_bytes",
        description="Bytes the request stream (and the dead-letter stream) may hold; past it "
        "new requests are refused (503) instead of old ones being dropped unseen.",
    )
    max_message_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        validation_alias="nats_max_message_bytes",
        description="Largest request flotilla publishes (413 above), also the streams' message "
        "limit; the server's max_payload (1 MB unless configured) caps requests and replies.",
    )
    deadline_lanes_ms: tuple[int, ...] = Field(
        default=(),
        validation_alias="nats_deadline_lanes_ms",
        description="Bounds (ms, rising) that split each model's queue by the request's time "
        "budget (its x-request-timeout-ms, or --request-timeout-s): a request within the "
        "first bound goes to the most urgent lane, and so on; workers take from the most "
        "urgent lane first, so a request that must be answered soon passes those that can "
        "wait, across every worker. Empty: one queue per model, in arrival order. Gateways "
        "and workers must be given the same bounds.",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        validation_alias="nats_replicas",
        description="Copies of each stream in a NATS cluster (at most 5): 3 survives a "
        "server loss, at the cost of a replicated write per request; 1 on a single server.",
    )

    @field_validator("deadline_lanes_ms", mode="before")
    @classmethod
    def _bounds(cls, value: object) -> object:
        if isinstance(value, str):  # an environment variable or flag: "2000,8000"
            value = tuple(v.strip() for v in value.split(",") if v.strip())
        return value

    @field_validator("deadline_lanes_ms")
    @classmethod
    def _rising(cls, bounds: tuple[int, ...]) -> tuple[int, ...]:
        if any(b <= 0 for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"give positive bounds in ms, rising, like 2000,8000: got {bounds}")
        return bounds

    def lanes(self, model: str) -> list[Lane]:
        """The model's lanes, the most urgent first."""
        return [Lane(model, i) for i in range(len(self.deadline_lanes_ms) + 1)]

    def lane_of(self, model: str, budget_s: float) -> Lane:
        """The lane of a request of ``model`` with ``budget_s`` to be answered in."""
        bounds = self.deadline_lanes_ms
        index = next((i for i, b in enumerate(bounds) if budget_s * 1e3 <= b), len(bounds))
        return Lane(model, index)

    def lane_subject(self, lane: Lane) -> str:
        # A model is one subject token: ``<prefix>.<model>`` never matches a lane's.
        return self.subject(lane.model) + self._lane_suffix(lane, ".")

    def lane_consumer(self, lane: Lane) -> str:
        # ``_`` is followed by two upper-case hex digits in a token, never by ``d``.
        return self.consumer(lane.model) + self._lane_suffix(lane, "_")

    def _lane_suffix(self, lane: Lane, separator: str) -> str:
        last = lane.index == len(self.deadline_lanes_ms)
        return "" if last else f"{separator}d{lane.index}"

    @property
    def dead_stream(self) -> str:
        return f"{self.stream}_DEAD"

    @property
    def dead_prefix(self) -> str:
        return f"{self.subject_prefix}_dead"

    @property
    def workers_bucket(self) -> str:
        return f"{self.stream}_workers"

    def subject(self, model: str) -> str:
        return f"{self.subject_prefix}.{subject_token(model)}"

    @property
    def withdrawn_subject(self) -> str:
        """Core NATS, outside every stream: a gateway names a job whose client left, and
        the worker holding it stops it (``{subject_prefix}.>`` does not match it)."""
        return f"{self.subject_prefix}-withdrawn"

    def dead_subject(self, model: str) -> str:
        return f"{self.dead_prefix}.{subject_token(model)}"

    def consumer(self, model: str) -> str:
        return f"{CONSUMER_PREFIX}-{subject_token(model)}"


def subject_token(name: str) -> str:
    """One subject token (and consumer name) per model name, distinct names kept distinct:
    anything but letters, digits, ``-`` is written ``_XX`` (its UTF-8 bytes in hex)."""
    return re.sub(
        r"[^A-Za-z0-9-]", lambda m: "".join(f"_{b:02X}" for b in m.group().encode()), name
    )
