"""Jobs and their outcomes as NATS messages, for the JetStream work queue.

A request message is the raw body as the payload with the gateway's annotations as
headers, so a worker reads the routing fields without touching the body; its
``Nats-Msg-Id`` is the job id, which JetStream deduplicates publishes by. A reply is
the finished response body (or the error message) with the timings, or the error's
class, status and headers, as headers. Pure functions: no client, no clock.
"""

from __future__ import annotations

import json

from embedder.core import tracing
from embedder.core.errors import FlotillaError
from embedder.core.jobs import ApiShape, Job, JobResult, Timings
from embedder.queue.protocol import Outcome, Partial

Headers = dict[str, str]

MSG_ID = "Nats-Msg-Id"  # JetStream stores a publish retried with the same id once
ID = "flotilla-id"  # the correlation id: the job's id, on the request and its reply
# request
MODEL = "flotilla-model"
ADAPTER = "flotilla-adapter"
SHAPE = "flotilla-shape"
TASK = "flotilla-task"
EST_TOKENS = "flotilla-est-tokens"
DEADLINE = "flotilla-deadline"
ENQUEUED_AT = "flotilla-enqueued-at"
PRIORITY = "flotilla-priority"
REPLY_TO = "flotilla-reply-to"
# reply
STATUS = "flotilla-status"  # "ok" or "error"
PROMPT_TOKENS = "flotilla-prompt-tokens"
QUEUE_S = "flotilla-queue-s"
INFERENCE_S = "flotilla-inference-s"
MEDIA_TYPE = "flotilla-media-type"
EXTRA_HEADERS = "flotilla-extra-headers"  # JSON object
ERROR_CODE = "flotilla-error-code"
HTTP_STATUS = "flotilla-http-status"
RETRIABLE = "flotilla-retriable"
ERROR_HEADERS = "flotilla-error-headers"  # JSON object
# dead letters
DEAD_REASON = "flotilla-dead-reason"
DEAD_DELIVERIES = "flotilla-dead-deliveries"
PART = "flotilla-part"  # on a part of a streamed answer: its seq; the outcome has none


class MalformedRecord(ValueError):
    """A message without the headers flotilla writes, or with unreadable ones."""


def _text(value: str | int | float) -> str:
    # repr() of a float round-trips exactly, so deadlines survive the trip to the bit.
    return repr(value) if isinstance(value, float) else str(value)


def _shape(value: str) -> str:
    """A built-in shape as its ApiShape member (codecs dispatch on those), another as is."""
    return ApiShape(value) if value in ApiShape._value2member_map_ else value


def encode_job(job: Job, reply_to: str) -> Headers:
    """The headers of a job's message; the payload is ``job.body`` itself."""
    headers = {
        MSG_ID: job.id,
        ID: job.id,
        MODEL: job.model,
        SHAPE: str(job.shape),
        TASK: job.task,
        EST_TOKENS: _text(job.est_tokens),
        DEADLINE: _text(job.deadline),
        ENQUEUED_AT: _text(job.enqueued_at),
        PRIORITY: _text(job.priority),
        REPLY_TO: reply_to,
    }
    if job.adapter is not None:
        headers[ADAPTER] = job.adapter
    headers.update(job.trace)  # traceparent (W3C), as any traced consumer reads it
    return headers


def decode_job(
    headers: Headers | None, payload: bytes | None, deliveries: int = 1
) -> tuple[Job, str]:
    """The job and the subject its reply goes to; ``MalformedRecord`` when not one.
    ``deliveries`` is the server's count for this delivery of the message (its metadata,
    not a header): a worker treats a job handed back before differently."""
    fields = headers or {}
    try:
        job = Job(
            id=fields[ID],
            model=fields[MODEL],
            shape=_shape(fields[SHAPE]),
            task=fields.get(TASK, ""),
            body=payload or b"",
            est_tokens=int(fields[EST_TOKENS]),
            deadline=float(fields[DEADLINE]),
            enqueued_at=float(fields[ENQUEUED_AT]),
            adapter=fields.get(ADAPTER),
            priority=int(fields.get(PRIORITY, "0")),
            deliveries=deliveries,
            trace=tracing.carried(fields),
        )
        return job, fields[REPLY_TO]
    except KeyError as exc:
        raise MalformedRecord(f"header {exc.args[0]!r} is missing") from None
    except ValueError as exc:
        raise MalformedRecord(f"a header is invalid: {exc}") from None


def encode_outcome(job_id: str, outcome: Outcome) -> tuple[bytes, Headers]:
    """The payload and headers of a reply."""
    if isinstance(outcome, FlotillaError):
        return outcome.message.encode(), {
            ID: job_id,
            STATUS: "error",
            ERROR_CODE: outcome.code,
            HTTP_STATUS: _text(outcome.http_status),
            RETRIABLE: "1" if outcome.retriable else "0",
            ERROR_HEADERS: json.dumps(outcome.headers),
        }
    headers = {
        ID: job_id,
        STATUS: "ok",
        PROMPT_TOKENS: _text(outcome.prompt_tokens),
        QUEUE_S: _text(outcome.timings.queue_s),
        INFERENCE_S: _text(outcome.timings.inference_s),
        MEDIA_TYPE: outcome.media_type,
    }
    if outcome.extra_headers:
        headers[EXTRA_HEADERS] = json.dumps(outcome.extra_headers)
    return outcome.body, headers


def reply_id(headers: Headers | None) -> str | None:
    """The correlation id of a reply, without decoding the rest."""
    return (headers or {}).get(ID)


def decode_outcome(headers: Headers | None, payload: bytes | None) -> Outcome:
    """The result, or the error rebuilt as the class the worker raised (same status,
    code and message), so the client sees what an in-process worker would give it."""
    fields = headers or {}
    body = payload or b""
    try:
        if fields[STATUS] == "error":
            return rebuild_error(
                code=fields[ERROR_CODE],
                http_status=int(fields[HTTP_STATUS]),
                retriable=fields.get(RETRIABLE) == "1",
                message=body.decode(errors="replace"),
                headers=json.loads(fields.get(ERROR_HEADERS, "{}")),
            )
        return JobResult(
            body=body,
            prompt_tokens=int(fields[PROMPT_TOKENS]),
            timings=Timings(queue_s=float(fields[QUEUE_S]), inference_s=float(fields[INFERENCE_S])),
            media_type=fields[MEDIA_TYPE],
            extra_headers=json.loads(fields.get(EXTRA_HEADERS, "{}")),
        )
    except KeyError as exc:
        raise MalformedRecord(f"header {exc.args[0]!r} is missing") from None
    except ValueError as exc:  # json.JSONDecodeError included
        raise MalformedRecord(f"a header is invalid: {exc}") from None


def _error_classes() -> dict[str, type[FlotillaError]]:
    """Every FlotillaError subclass defined so far, by code (the first one wins)."""
    found: dict[str, type[FlotillaError]] = {}
    stack: list[type[FlotillaError]] = [FlotillaError]
    while stack:
        cls = stack.pop(0)
        found.setdefault(cls.code, cls)
        stack.extend(cls.__subclasses__())
    return found


def rebuild_error(
    *, code: str, http_status: int, retriable: bool, message: str, headers: dict[str, str]
) -> FlotillaError:
    cls = _error_classes().get(code, FlotillaError)
    # Subclasses' constructors differ (Overloaded wants retry_after_s); the base one sets
    # everything the handler reads: message, headers and the args.
    error = cls.__new__(cls)
    FlotillaError.__init__(error, message, headers={str(k): str(v) for k, v in headers.items()})
    if (cls.code, cls.http_status, cls.retriable) != (code, http_status, retriable):
        error.code, error.http_status, error.retriable = code, http_status, retriable
    return error


def encode_partial(job_id: str, partial: Partial) -> tuple[bytes, Headers]:
    """A part of a streamed answer, to the job's reply subject like its outcome."""
    return partial.body, {ID: job_id, PART: str(partial.seq)}


def decode_partial(headers: Headers | None, payload: bytes) -> Partial | None:
    """The part a reply message carries; None when it is the outcome (no part header)."""
    seq = (headers or {}).get(PART)
    if seq is None:
        return None
    try:
        return Partial(int(seq), payload)
    except ValueError:
        raise MalformedRecord(f"part number {seq!r} is not an integer") from None
