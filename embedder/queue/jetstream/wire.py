"""Jobs and outcomes as NATS messages: the same headers as the Kafka records
(``embedder.queue.kafka.wire``, pure), as the string map NATS headers are, plus the
id JetStream deduplicates publishes by. Pure functions: no client, no clock."""

from __future__ import annotations

from embedder.jobs import EmbedJob
from embedder.queue.kafka import wire as records
from embedder.queue.kafka.wire import MalformedRecord
from embedder.queue.protocol import Outcome, Partial

__all__ = ["DEAD_REASON", "MalformedRecord", "decode_job", "decode_outcome", "encode_job"]

Headers = dict[str, str]

MSG_ID = "Nats-Msg-Id"  # JetStream stores a publish retried with the same id once
DEAD_REASON = "flotilla-dead-reason"
DEAD_DELIVERIES = "flotilla-dead-deliveries"
PART = "flotilla-part"  # on a part of a streamed answer: its seq; the outcome has none


def _to_nats(headers: records.Headers) -> Headers:
    return {key: value.decode() for key, value in headers}


def _from_nats(headers: Headers | None) -> records.Headers:
    return [(key, value.encode()) for key, value in (headers or {}).items()]


def encode_job(job: EmbedJob, reply_to: str) -> Headers:
    """The headers of a job's message; the payload is ``job.body`` itself."""
    return {**_to_nats(records.encode_job(job, reply_to)), MSG_ID: job.id}


def decode_job(headers: Headers | None, payload: bytes) -> tuple[EmbedJob, str]:
    """The job and the subject its reply goes to; ``MalformedRecord`` when not one."""
    return records.decode_job(_from_nats(headers), payload)


def encode_outcome(job_id: str, outcome: Outcome) -> tuple[bytes, Headers]:
    payload, headers = records.encode_outcome(job_id, outcome)
    return payload, _to_nats(headers)


def reply_id(headers: Headers | None) -> str | None:
    return (headers or {}).get(records.ID)


def decode_outcome(headers: Headers | None, payload: bytes) -> Outcome:
    return records.decode_outcome(_from_nats(headers), payload)


def encode_partial(job_id: str, partial: Partial) -> tuple[bytes, Headers]:
    """A part of a streamed answer, to the job's reply subject like its outcome."""
    return partial.body, {records.ID: job_id, PART: str(partial.seq)}


def decode_partial(headers: Headers | None, payload: bytes) -> Partial | None:
    """The part a reply message carries; None when it is the outcome (no part header)."""
    seq = (headers or {}).get(PART)
    if seq is None:
        return None
    try:
        return Partial(int(seq), payload)
    except ValueError:
        raise MalformedRecord(f"part number {seq!r} is not an integer") from None
