"""Classified errors: each knows its HTTP status and whether a retry can help.

One exception handler in the gateway maps them; the worker delivers them to
every request of a failed batch.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any


class FlotillaError(Exception):
    """Base class. ``http_status`` and ``retriable`` drive the handler and retries."""

    http_status = 500
    retriable = False
    code = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class InvalidRequest(FlotillaError):
    http_status = 422
    code = "invalid_request"


class LimitExceeded(FlotillaError):
    """A request over a configured limit; the message names the limit and its setting."""

    http_status = 413
    code = "limit_exceeded"


class Unauthorized(FlotillaError):
    http_status = 401
    code = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class ModelNotFound(FlotillaError):
    http_status = 404
    code = "model_not_found"


class FleetConflict(FlotillaError):
    """A change to a running server's fleet that the fleet's rules refuse (the admin
    API): removing its last model, say. The message says what to do instead."""

    http_status = 409
    code = "fleet_conflict"


class ModelExists(FleetConflict):
    """A model added under a name or alias that a model of the fleet already uses."""

    code = "model_exists"


class AdapterNotFound(ModelNotFound):
    code = "adapter_not_found"


class AdapterInvalid(FlotillaError):
    """An adapter folder that cannot serve its base: files missing, not a LoRA, trained
    for another base model, or weights whose shapes do not fit."""

    http_status = 422
    code = "adapter_invalid"


class TaskNotSupported(FlotillaError):
    http_status = 400
    code = "task_not_supported"


class ContextWindowExceeded(FlotillaError):
    """A generation request whose prompt (plus the tokens it asks for) does not fit the
    model's context window; the message says how long it was and the limit."""

    http_status = 400
    code = "context_length_exceeded"  # the code OpenAI's API answers with


class Overloaded(FlotillaError):
    """Admission refused: too many tokens in flight for this model."""

    http_status = 429
    retriable = True
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})
        self.retry_after_s = retry_after_s


class NotReady(FlotillaError):
    http_status = 503
    retriable = True
    code = "not_ready"

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class NoRoom(NotReady):
    """A model could not load in time: the device's memory budget is held by models that
    are pinned or have work in hand."""

    code = "no_room"


class AdapterBuilding(NotReady):
    """An adapter whose graph for the model's runtime is still being built (an exported
    graph with the adapter merged in: tens of seconds, once per adapter and runtime).
    ``ready`` completes when the build ends, so a worker can hold the adapter's requests
    until then; a request that reaches a client with it may retry after Retry-After."""

    code = "adapter_building"
    ready: Future[Any] | None = None  # absent once the error crossed a queue

    def __init__(
        self, message: str, *, ready: Future[Any] | None = None, retry_after_s: int = 10
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.ready = ready


class DeadlineExceeded(FlotillaError):
    http_status = 504
    retriable = True
    code = "deadline_exceeded"


class InferenceFailed(FlotillaError):
    """The model raised while running a batch; every job of that batch gets it."""

    http_status = 500
    retriable = True
    code = "inference_failed"


class Undeliverable(FlotillaError):
    """The shared queue gave a request to workers as often as it allows and none answered
    (each died or handed it back): it was dead-lettered. Retrying the same body is likely
    to fail the same way."""

    http_status = 502
    code = "undeliverable"


class LinkRefused(FlotillaError):
    """A server flotilla connects to (NATS, Kafka) refused the link's security, or the link
    could not be secured: credentials rejected, a certificate that failed verification on
    either side, TLS files that cannot be read. Retrying with the same settings meets the
    same answer, so it stops the start; the message names the setting to fix."""

    http_status = 503
    code = "link_refused"
