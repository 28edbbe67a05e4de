"""The four wire formats: decoding request bodies, shaping vectors, encoding replies."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import numpy as np
import pytest
from numpy.typing import NDArray

from embedder.core.errors import InvalidRequest, LimitExceeded
from embedder.core.jobs import ApiShape
from embedder.tasks.embed.codecs import (
    EmbedRequest,
    RequestLimits,
    base64_rows,
    decode_embed,
    encode_embed,
    json_with_vectors,
    raw_vectors_body,
    shape_vectors,
)

OPENAI = ApiShape.OPENAI_EMBEDDINGS
TEI = ApiShape.TEI_EMBED
TEI_RERANK = ApiShape.TEI_RERANK
COHERE = ApiShape.COHERE_RERANK
LIMITS = RequestLimits()


def body(payload: object) -> bytes:
    return json.dumps(payload).encode()


def vectors(rows: list[list[float]]) -> NDArray[np.float32]:
    return np.asarray(rows, dtype=np.float32)


def unit_rows(v: NDArray[np.float32]) -> NDArray[np.float32]:
    return np.asarray(v / np.linalg.norm(v, axis=1, keepdims=True), dtype=np.float32)


def reply(raw: bytes) -> Any:
    return json.loads(raw)


# -- decoding embeddings ----------------------------------------------------------


def test_openai_input_may_be_a_string_or_a_list() -> None:
    one = decode_embed(OPENAI, body({"input": "hello", "model": "m"}), LIMITS)
    many = decode_embed(OPENAI, body({"input": ["a", "b"], "model": "m"}), LIMITS)
    assert one.texts == ["hello"]
    assert many.texts == ["a", "b"]
    # OpenAI cannot ask for normalization; the model's default applies.
    assert one.normalize is None
    assert one.encoding == "float"


def test_openai_fields_and_unknown_fields() -> None:
    request = decode_embed(
        OPENAI,
        body({"input": "x", "encoding_format": "base64", "dimensions": 4, "extra": 1}),
        LIMITS,
    )
    assert request.encoding == "base64"
    assert request.dimensions == 4


def test_openai_truncation_follows_the_server_setting() -> None:
    raw = body({"input": "x"})
    assert decode_embed(OPENAI, raw, RequestLimits(auto_truncate=False)).truncate is False
    assert decode_embed(OPENAI, raw, RequestLimits(auto_truncate=True)).truncate is True


def test_tei_embed_fields() -> None:
    request = decode_embed(
        TEI,
        body(
            {"inputs": ["a"], "normalize": False, "truncate": True, "truncation_direction": "Left"}
        ),
        LIMITS,
    )
    assert request == EmbedRequest(texts=["a"], normalize=False, truncate=True, side="left")
    defaults = decode_embed(TEI, body({"inputs": "a"}), RequestLimits(auto_truncate=True))
    assert defaults.normalize is True
    assert defaults.truncate is True  # unset: the server's setting
    assert defaults.side == "right"
    explicit = decode_embed(
        TEI, body({"inputs": "a", "truncate": False}), RequestLimits(auto_truncate=True)
    )
    assert explicit.truncate is False  # the request's own choice wins


@pytest.mark.parametrize(
    ("shape", "raw", "message"),
    [
        (OPENAI, b"{not json", "not valid JSON"),
        (OPENAI, b"", "not valid JSON"),
        (OPENAI, body({"input": 3}), "invalid request body"),
        (OPENAI, body({"input": ["a", 2]}), "invalid request body"),
        (OPENAI, body({"model": "m"}), "invalid request body"),
        (OPENAI, body(["input"]), "invalid request body"),
        (OPENAI, body({"input": "x", "encoding_format": "int8"}), "invalid request body"),
        (OPENAI, body({"input": []}), "'input' must not be empty"),
        (OPENAI, body({"input": "x", "dimensions": 0}), "'dimensions' must be a positive"),
        (TEI, body({"inputs": "x", "normalize": "yes"}), "invalid request body"),
        (TEI, body({"inputs": "x", "truncation_direction": "up"}), "invalid request body"),
        (TEI, body({"inputs": []}), "'inputs' must not be empty"),
        (TEI, body({"inputs": "x", "dimensions": -3}), "'dimensions' must be a positive"),
    ],
)
def test_bad_embed_bodies_are_invalid_requests(shape: ApiShape, raw: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as caught:
        decode_embed(shape, raw, LIMITS)
    assert caught.value.http_status == 422


@pytest.mark.parametrize(
    ("input_type", "use"),
    [
        (None, None),
        ("query", "query"),
        ("search_query", "query"),
        ("document", "document"),
        ("passage", "document"),
        ("search_document", "document"),
    ],
)
def test_input_type_says_what_the_texts_are_for(input_type: str | None, use: str | None) -> None:
    payload: dict[str, object] = {"input": "x"}
    if input_type is not None:
        payload["input_type"] = input_type
    assert decode_embed(OPENAI, body(payload), LIMITS).use == use
    tei = {"inputs": "x", **({"input_type": input_type} if input_type else {})}
    assert decode_embed(TEI, body(tei), LIMITS).use == use


def test_tei_prompt_name_is_passed_on_by_name() -> None:
    request = decode_embed(TEI, body({"inputs": "x", "prompt_name": "passage"}), LIMITS)
    assert (request.prompt_name, request.use) == ("passage", None)
    # The OpenAI shape has no prompt_name: ignored like any unknown field.
    assert (
        decode_embed(OPENAI, body({"input": "x", "prompt_name": "q"}), LIMITS).prompt_name is None
    )


@pytest.mark.parametrize("shape", [OPENAI, TEI])
def test_an_unknown_input_type_is_a_422_naming_the_valid_ones(shape: ApiShape) -> None:
    field = "input" if shape is OPENAI else "inputs"
    with pytest.raises(InvalidRequest, match="'input_type' is 'clustering'; send one of") as caught:
        decode_embed(shape, body({field: "x", "input_type": "clustering"}), LIMITS)
    assert "'query'" in caught.value.message and "'passage'" in caught.value.message


def test_raw_vectors_bodies_carry_the_use() -> None:
    raw = ApiShape.RAW_VECTORS
    assert decode_embed(raw, raw_vectors_body(["d"], use="document"), LIMITS).use == "document"
    assert decode_embed(raw, raw_vectors_body(["q"], use="query"), LIMITS).use == "query"
    plain = raw_vectors_body(["x"], truncate=True)
    assert json.loads(plain) == {"inputs": ["x"], "truncate": True}  # unchanged without a use


def test_too_many_inputs_names_the_limit_and_its_setting() -> None:
    limits = RequestLimits(max_inputs=2)
    decode_embed(TEI, body({"inputs": ["a", "b"]}), limits)  # at the limit is fine
    with pytest.raises(LimitExceeded) as caught:
        decode_embed(TEI, body({"inputs": ["a", "b", "c"]}), limits)
    assert caught.value.http_status == 413
    assert "3 items" in caught.value.message
    assert "limit of 2" in caught.value.message
    assert "--max-inputs-per-request" in caught.value.message
    assert "FLOTILLA_MAX_INPUTS_PER_REQUEST" in caught.value.message


# -- decoding reranks ---------------------------------------------------------------


# -- shaping vectors ----------------------------------------------------------------


RAW = vectors([[3.0, 4.0, 12.0, 0.0], [1.0, 0.0, 0.0, 1.0]])


def test_shape_vectors_normalizes_by_the_models_default() -> None:
    request = EmbedRequest(texts=["a", "b"])
    np.testing.assert_allclose(shape_vectors(RAW, request, True), unit_rows(RAW), rtol=1e-6)
    np.testing.assert_array_equal(shape_vectors(RAW, request, False), RAW)


def test_shape_vectors_follows_the_requests_normalize() -> None:
    keep = EmbedRequest(texts=["a", "b"], normalize=False)
    np.testing.assert_array_equal(shape_vectors(RAW, keep, True), RAW)


def test_dimensions_truncate_then_renormalize() -> None:
    request = EmbedRequest(texts=["a", "b"], dimensions=2)
    shaped = shape_vectors(RAW, request, True)
    assert shaped.shape == (2, 2)
    np.testing.assert_allclose(shaped, [[0.6, 0.8], [1.0, 0.0]], rtol=1e-6)
    raw_cut = shape_vectors(RAW, EmbedRequest(texts=["a"], dimensions=2, normalize=False), True)
    np.testing.assert_array_equal(raw_cut, RAW[:, :2])


def test_dimensions_over_the_models_size_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="'dimensions' is 5, but this model has 4"):
        shape_vectors(RAW, EmbedRequest(texts=["a"], dimensions=5), True)


def test_shape_vectors_leaves_a_zero_vector_finite() -> None:
    shaped = shape_vectors(vectors([[0.0, 0.0]]), EmbedRequest(texts=["a"]), True)
    assert np.isfinite(shaped).all()


# -- encoding embeddings -------------------------------------------------------------


def test_openai_float_reply() -> None:
    request = EmbedRequest(texts=["a", "b"])
    out = reply(encode_embed(OPENAI, request, RAW, "mini", 7))
    assert out["object"] == "list"
    assert out["model"] == "mini"
    assert out["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [d["index"] for d in out["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in out["data"])
    np.testing.assert_array_equal(vectors([d["embedding"] for d in out["data"]]), RAW)


def test_openai_base64_round_trips_the_float32_values() -> None:
    # Values float32 cannot hold exactly in decimal; base64 must carry the very same bits.
    rng = np.random.default_rng(7)
    raw = rng.standard_normal((3, 5)).astype(np.float32)
    request = EmbedRequest(texts=["a", "b", "c"], encoding="base64")
    out = reply(encode_embed(OPENAI, request, raw, "mini", 3))
    decoded = np.stack(
        [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in out["data"]]
    )
    np.testing.assert_array_equal(decoded, raw)


def test_tei_reply_is_a_bare_list_of_vectors() -> None:
    out = reply(encode_embed(TEI, EmbedRequest(texts=["a", "b"]), RAW, "mini", 7))
    np.testing.assert_array_equal(vectors(out), RAW)


def test_decode_shape_encode_round_trip_for_tei_normalize_false() -> None:
    request = decode_embed(TEI, body({"inputs": ["a", "b"], "normalize": False}), LIMITS)
    out = reply(encode_embed(TEI, request, shape_vectors(RAW, request, True), "mini", 2))
    np.testing.assert_array_equal(vectors(out), RAW)


# -- encoding reranks ----------------------------------------------------------------

SCORES = np.asarray([0.1, 0.9, 0.5, 0.9], dtype=np.float32)
DOCS = ["zero", "one", "two", "three"]


# -- float32 vectors written without Python floats -------------------------------------

EDGE_VALUES = np.array(
    [
        0.1,
        -1 / 3,
        1e-45,  # the smallest subnormal float32
        1.1754944e-38,  # the smallest normal float32
        -3.4028235e38,  # the largest magnitude
        3.4028235e38,
        -0.0,
        0.0,
        1.0,
        123456.789,
    ],
    dtype=np.float32,
)


def as_float32(body: bytes) -> NDArray[np.float32]:
    return np.asarray(json.loads(body), dtype=np.float32)


@pytest.mark.parametrize(
    "matrix",
    [
        np.random.default_rng(3).standard_normal((6, 384)).astype(np.float32),
        np.stack([EDGE_VALUES, -EDGE_VALUES]),
    ],
    ids=["normal", "edges"],
)
def test_vector_json_reads_back_as_msgspecs_float32_values(matrix: NDArray[np.float32]) -> None:
    ours = as_float32(json_with_vectors(matrix))
    theirs = as_float32(msgspec.json.encode(matrix.tolist()))
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours, matrix)
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(matrix))  # -0.0 stays -0.0


def test_openai_float_reply_reads_back_as_msgspecs() -> None:
    matrix = np.stack([EDGE_VALUES, EDGE_VALUES[::-1].copy()])
    out = reply(encode_embed(OPENAI, EmbedRequest(texts=["a", "b"]), matrix, "mini", 2))
    before = json.loads(
        msgspec.json.encode(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": row}
                    for i, row in enumerate(matrix.tolist())
                ],
                "model": "mini",
                "usage": {"prompt_tokens": 2, "total_tokens": 2},
            }
        )
    )
    for got, want in zip(out["data"], before["data"], strict=True):
        assert {k: v for k, v in got.items() if k != "embedding"} == {
            k: v for k, v in want.items() if k != "embedding"
        }
        np.testing.assert_array_equal(np.float32(got["embedding"]), np.float32(want["embedding"]))
    assert {k: v for k, v in out.items() if k != "data"} == {
        k: v for k, v in before.items() if k != "data"
    }


def test_base64_rows_are_each_rows_little_endian_bytes() -> None:
    matrix = np.stack([EDGE_VALUES, -EDGE_VALUES])
    want = [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in matrix]
    assert base64_rows(matrix) == want
    assert base64_rows(matrix.astype(">f4")) == want  # big-endian input, same wire bytes
