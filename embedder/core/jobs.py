"""Messages between the gateway, the work queue and the workers.

A job carries the raw request body, unparsed: the gateway only annotates it
(model, adapter, task, estimated tokens, deadline) and the worker decodes it.
The reply is the finished response body, so the gateway never touches
vectors either.
"""

from __future__ import annotations

import enum
import math
import uuid
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable


class Task(enum.StrEnum):
    EMBED = "embed"
    RERANK = "rerank"
    GENERATE = "generate"
    OCR = "ocr"


class ApiShape(enum.StrEnum):
    """The wire format of a request body; picks the codec that decodes and encodes it."""

    OPENAI_EMBEDDINGS = "openai_embeddings"
    TEI_EMBED = "tei_embed"
    TEI_ROOT = "tei_root"  # TEI's root: an embed body, or a similarity one (HF clients)
    TEI_SIMILARITY = "tei_similarity"
    TEI_RERANK = "tei_rerank"
    COHERE_RERANK = "cohere_rerank"
    COHERE_EMBED_V2 = "cohere_embed_v2"
    COHERE_RERANK_V2 = "cohere_rerank_v2"
    RAW_VECTORS = "raw_vectors"  # internal (ingest, search): TEI body in, float32 bytes out
    OPENAI_CHAT = "openai_chat"  # /v1/chat/completions
    OPENAI_COMPLETIONS = "openai_completions"  # /v1/completions
    MISTRAL_OCR = "mistral_ocr"  # /v1/ocr: the contract is in embedder.tasks.ocr.api


TASK_OF_SHAPE: dict[ApiShape, Task] = {
    ApiShape.OPENAI_EMBEDDINGS: Task.EMBED,
    ApiShape.TEI_EMBED: Task.EMBED,
    ApiShape.TEI_ROOT: Task.EMBED,
    ApiShape.TEI_SIMILARITY: Task.EMBED,
    ApiShape.TEI_RERANK: Task.RERANK,
    ApiShape.COHERE_RERANK: Task.RERANK,
    ApiShape.COHERE_EMBED_V2: Task.EMBED,
    ApiShape.COHERE_RERANK_V2: Task.RERANK,
    ApiShape.RAW_VECTORS: Task.EMBED,
    ApiShape.OPENAI_CHAT: Task.GENERATE,
    ApiShape.OPENAI_COMPLETIONS: Task.GENERATE,
    ApiShape.MISTRAL_OCR: Task.OCR,
}


BUILT_IN_TASKS = frozenset(Task)

# Which end of an over-long input is cut: requests say it, runtimes do it.
TruncationSide = Literal["right", "left"]

# ready: resident and serving; evicted: not resident (an on-demand model before its first
# request, or evicted for another's memory), its next request loads it.
ModelState = Literal["loading", "ready", "evicted", "failed"]


class ModelStates(Protocol):
    """What is known of the models behind the queue: the model host of this process, or
    the heartbeats of other processes' workers. The gateway reads it for 503s, /ready
    and /v1/models."""

    def state(self, model: str) -> ModelState: ...

    def describe(self, model: str) -> dict[str, object]: ...


@runtime_checkable
class LoadsOnDemand(Protocol):
    """Model states that load a model for the request that needs it (the model host of
    ``flotilla serve``): the gateway calls ``demand`` for every request instead of
    reading the state itself."""

    def demand(self, model: str, deadline: float) -> None:
        """Make ``model`` resident for a request due by ``deadline`` (wall clock): note
        its use, start (or join) its load if it is not resident. Raises ``NotReady``
        (with Retry-After) when it cannot serve the request in time: still loading at
        start, failed, or a load measured longer than the time left."""


def split_model(name: str) -> tuple[str, str | None]:
    """``"base:adapter"`` -> (base, adapter); a plain name has no adapter. ``"base:"``
    names an empty adapter, kept so that it is refused rather than read as the base."""
    base, colon, adapter = name.partition(":")
    return base, adapter if colon else None


@dataclass(frozen=True, slots=True)
class Job:
    """One annotated request waiting in the work queue.

    Times are wall-clock seconds (``time.time()``) so that they stay
    meaningful when the queue spans machines.
    """

    id: str
    model: str
    shape: str  # the API shape of the body (ApiShape for the built-in kinds)
    body: bytes
    est_tokens: int
    deadline: float
    enqueued_at: float
    adapter: str | None = None
    priority: int = 0  # lower runs first among jobs with the same deadline
    task: str = ""  # the task kind that answers it (embedder.tasks.registry)
    # How many times a queue has handed this job to a worker, this time included. A
    # worker hands back a job it cannot finish in time only on its first delivery, so a
    # job no worker can finish in time bounces once, not until its deadline.
    deliveries: int = 1
    # The request's trace context as W3C trace-context headers (embedder.core.tracing),
    # empty while tracing is off: the worker's spans of this job continue that trace.
    trace: tuple[tuple[str, str], ...] = ()

    @property
    def budget_s(self) -> float:
        """The time it was given to be answered in (its timeout), not what is left of it."""
        return self.deadline - self.enqueued_at

    @classmethod
    def new(
        cls,
        model: str,
        shape: str,
        body: bytes,
        *,
        now: float,
        timeout_s: float,
        bytes_per_token: float,
        priority: int = 0,
        adapter: str | None = None,
        est_tokens: int | None = None,
        task: str = "",
    ) -> Job:
        """A fresh job, its size estimated from the body without parsing it (unless the
        caller estimated better: ``embedder.core.rawjson.estimate_tokens``)."""
        return cls(
            id=uuid.uuid4().hex,
            model=model,
            shape=shape,
            body=body,
            est_tokens=est_tokens or max(1, math.ceil(len(body) / bytes_per_token)),
            deadline=now + timeout_s,
            enqueued_at=now,
            adapter=adapter,
            priority=priority,
            task=task,
        )

    def __post_init__(self) -> None:
        """A built-in shape names its kind; a job of another kind names its task. A
        built-in kind's job in a shape that kind does not decode is a ValueError."""
        if not self.task:
            object.__setattr__(self, "task", TASK_OF_SHAPE[ApiShape(self.shape)].value)
        elif self.task in BUILT_IN_TASKS and TASK_OF_SHAPE.get(self.shape) != self.task:  # type: ignore[call-overload]
            raise ValueError(f"a {self.task} job cannot be in shape {self.shape!r}")

    @property
    def group(self) -> tuple[str, str | None, str]:
        """Jobs of one group can share a forward pass."""
        return (self.model, self.adapter, self.task)


@dataclass(frozen=True, slots=True)
class Timings:
    queue_s: float
    inference_s: float


@dataclass(frozen=True, slots=True)
class JobResult:
    """A finished response: the encoded body plus what the gateway puts in headers."""

    body: bytes
    prompt_tokens: int
    timings: Timings
    media_type: str = "application/json"
    extra_headers: dict[str, str] = field(default_factory=dict)
