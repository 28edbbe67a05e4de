"""Jobs and outcomes as Kafka records: exact round trips, every error class with its status,
and clear refusals of records flotilla did not write. No broker needed."""

from __future__ import annotations

import time

import pytest

from embedder.errors import (
    DeadlineExceeded,
    FlotillaError,
    InferenceFailed,
    InvalidRequest,
    LimitExceeded,
    ModelNotFound,
    NotReady,
    Overloaded,
    TaskNotSupported,
    Unauthorized,
)
from embedder.jobs import ApiShape, EmbedJob, JobResult, Timings
from embedder.queue.kafka import wire


def a_job(**changes: object) -> EmbedJob:
    now = time.time()
    fields: dict[str, object] = {
        "id": "0123abcd",
        "model": "all-minilm-l6-v2",
        "shape": ApiShape.OPENAI_EMBEDDINGS,
        "body": b'{"input": ["a", "b"]}',
        "est_tokens": 7,
        "deadline": now + 1 / 3,  # a float with every bit set: repr must round-trip it
        "enqueued_at": now,
        "priority": -2,
    }
    fields.update(changes)
    return EmbedJob(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("adapter", [None, "legal-de"])
def test_a_job_survives_the_trip(adapter: str | None) -> None:
    job = a_job(adapter=adapter)
    headers = wire.encode_job(job, "flotilla.replies.gw-1")
    assert wire.decode_job(headers, job.body) == (job, "flotilla.replies.gw-1")


def test_a_result_survives_the_trip() -> None:
    result = JobResult(
        body=b'{"data": []}',
        prompt_tokens=12,
        timings=Timings(queue_s=0.001234, inference_s=1 / 7),
        media_type="application/octet-stream",
        extra_headers={"x-dimension": "384"},
    )
    value, headers = wire.encode_outcome("j1", result)
    assert wire.reply_id(headers) == "j1"
    assert wire.decode_outcome(headers, value) == result


ERRORS: list[FlotillaError] = [
    InvalidRequest("inputs must be strings"),
    LimitExceeded("over 512 inputs"),
    Unauthorized("no key"),
    ModelNotFound("no model 'x'"),
    TaskNotSupported("cannot embed"),
    Overloaded("busy", retry_after_s=3),
    NotReady("loading", retry_after_s=7),
    DeadlineExceeded("too late"),
    InferenceFailed("the model raised"),
    FlotillaError("something else"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_an_error_comes_back_as_its_class_with_its_status(error: FlotillaError) -> None:
    value, headers = wire.encode_outcome("j1", error)
    back = wire.decode_outcome(headers, value)
    assert type(back) is type(error)
    assert isinstance(back, FlotillaError)
    assert (back.http_status, back.code, back.retriable) == (
        error.http_status,
        error.code,
        error.retriable,
    )
    assert back.message == error.message == str(back)
    assert back.headers == error.headers


def test_an_error_of_an_unknown_class_keeps_its_status_and_code() -> None:
    class StoreDown(FlotillaError):  # defined only on the worker's side, say
        http_status = 502
        code = "store_down_somewhere_else"
        retriable = True

    value, headers = wire.encode_outcome("j1", StoreDown("the store is down"))
    headers = [(k, v) for k, v in headers if k != wire.ERROR_CODE] + [
        (wire.ERROR_CODE, b"not_a_known_code")
    ]
    back = wire.decode_outcome(headers, value)
    assert type(back) is FlotillaError
    assert (back.http_status, back.code, back.retriable) == (502, "not_a_known_code", True)
    assert back.message == "the store is down"


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(wire.ID, b"x")],
        [(k, b"NaN-ish" if k == wire.EST_TOKENS else v) for k, v in wire.encode_job(a_job(), "r")],
        [(k, b"\xff" if k == wire.MODEL else v) for k, v in wire.encode_job(a_job(), "r")],
        [(k, b"no_such_shape" if k == wire.SHAPE else v) for k, v in wire.encode_job(a_job(), "r")],
    ],
)
def test_a_record_flotilla_did_not_write_is_refused(headers: list[tuple[str, bytes]]) -> None:
    with pytest.raises(wire.MalformedRecord):
        wire.decode_job(headers, b"{}")


def test_a_reply_without_its_headers_is_refused() -> None:
    with pytest.raises(wire.MalformedRecord):
        wire.decode_outcome([(wire.ID, b"j1"), (wire.STATUS, b"ok")], b"{}")
