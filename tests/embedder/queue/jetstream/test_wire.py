"""Jobs and outcomes as NATS messages: exact round trips, every error class with its status,
and clear refusals of messages flotilla did not write. No server needed."""

from __future__ import annotations

import time

import pytest

from embedder.core.errors import (
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
from embedder.core.jobs import ApiShape, Job, JobResult, Timings
from embedder.queue.jetstream import wire


def a_job(**changes: object) -> Job:
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
    return Job(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("adapter", [None, "legal-de"])
def test_a_job_survives_the_trip(adapter: str | None) -> None:
    job = a_job(adapter=adapter)
    headers = wire.encode_job(job, "flotilla.replies.gw-1")
    assert headers[wire.MSG_ID] == job.id  # JetStream stores a retried publish once
    assert wire.decode_job(headers, job.body) == (job, "flotilla.replies.gw-1")


def test_a_decoded_job_carries_the_servers_count_of_its_deliveries() -> None:
    job = a_job()
    headers = wire.encode_job(job, "flotilla.replies.gw-1")
    assert wire.decode_job(headers, job.body, 3)[0].deliveries == 3


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
    headers[wire.ERROR_CODE] = "not_a_known_code"
    back = wire.decode_outcome(headers, value)
    assert type(back) is FlotillaError
    assert (back.http_status, back.code, back.retriable) == (502, "not_a_known_code", True)
    assert back.message == "the store is down"


def _job_with(key: str, value: str | None) -> dict[str, str]:
    headers = wire.encode_job(a_job(), "r")
    if value is None:
        del headers[key]
    else:
        headers[key] = value
    return headers


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {wire.ID: "x"},
        _job_with(wire.EST_TOKENS, "NaN-ish"),
        _job_with(wire.DEADLINE, "soon"),
        _job_with(wire.SHAPE, "no_such_shape"),
        _job_with(wire.REPLY_TO, None),
    ],
)
def test_a_message_flotilla_did_not_write_is_refused(headers: dict[str, str] | None) -> None:
    with pytest.raises(wire.MalformedRecord):
        wire.decode_job(headers, b"{}")


def test_a_reply_without_its_headers_is_refused() -> None:
    with pytest.raises(wire.MalformedRecord):
        wire.decode_outcome({wire.ID: "j1", wire.STATUS: "ok"}, b"{}")
