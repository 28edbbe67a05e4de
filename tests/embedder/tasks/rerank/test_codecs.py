"""The rerank wire formats: TEI's and Cohere's v1 rerank bodies decoded, their answers
encoded (Cohere v2's: tests/embedder/tasks/embed/test_cohere_v2.py and the clients' tests)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from embedder.core.errors import InvalidRequest, LimitExceeded
from embedder.core.jobs import ApiShape
from embedder.tasks.embed.codecs import RequestLimits, decode_embed
from embedder.tasks.rerank import codecs
from embedder.tasks.rerank.codecs import RerankRequest

TEI = ApiShape.TEI_EMBED
TEI_RERANK = ApiShape.TEI_RERANK
COHERE = ApiShape.COHERE_RERANK
LIMITS = RequestLimits()
SCORES = np.asarray([0.1, 0.9, 0.5, 0.9], dtype=np.float32)
DOCS = ["zero", "one", "two", "three"]


def body(payload: object) -> bytes:
    return json.dumps(payload).encode()


def reply(raw: bytes) -> Any:
    return json.loads(raw)


def test_a_rerank_shape_is_not_an_embed_request_and_vice_versa() -> None:
    with pytest.raises(InvalidRequest):
        decode_embed(TEI_RERANK, body({"query": "q", "texts": ["a"]}), LIMITS)
    with pytest.raises(InvalidRequest):
        codecs.decode(TEI, body({"inputs": "a"}), LIMITS)


def test_tei_rerank_fields() -> None:
    request = codecs.decode(
        TEI_RERANK,
        body(
            {
                "query": "q",
                "texts": ["a", "b"],
                "return_text": True,
                "raw_scores": True,
                "truncate": True,
                "truncation_direction": "left",
            }
        ),
        LIMITS,
    )
    assert request == RerankRequest(
        query="q",
        documents=["a", "b"],
        truncate=True,
        side="left",
        return_documents=True,
        raw_scores=True,
    )


def test_cohere_documents_may_be_strings_or_objects_with_text() -> None:
    request = codecs.decode(
        COHERE,
        body({"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1}),
        LIMITS,
    )
    assert request.documents == ["a", "b"]
    assert request.top_n == 1
    assert request.return_documents is False


@pytest.mark.parametrize(
    ("shape", "raw", "message"),
    [
        (TEI_RERANK, b'{"query": ', "not valid JSON"),
        (TEI_RERANK, body({"query": "q"}), "invalid request body"),
        (TEI_RERANK, body({"query": "q", "texts": "a"}), "invalid request body"),
        (TEI_RERANK, body({"query": "q", "texts": []}), "'texts' must not be empty"),
        (COHERE, body({"query": 1, "documents": ["a"]}), "invalid request body"),
        (COHERE, body({"query": "q", "documents": [{"body": "a"}]}), "invalid request body"),
        (COHERE, body({"query": "q", "documents": []}), "'documents' must not be empty"),
        (COHERE, body({"query": "q", "documents": ["a"], "top_n": 0}), "'top_n' must be"),
    ],
)
def test_bad_rerank_bodies_are_invalid_requests(shape: ApiShape, raw: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        codecs.decode(shape, raw, LIMITS)


def test_too_many_documents_names_the_limit() -> None:
    with pytest.raises(LimitExceeded, match="'documents' has 3 items, over the limit of 2"):
        raw = body({"query": "q", "documents": ["a"] * 3})
        codecs.decode(COHERE, raw, RequestLimits(max_inputs=2))


def test_tei_rerank_reply_is_sorted_by_score() -> None:
    request = RerankRequest(query="q", documents=DOCS)
    out = reply(codecs.encode(TEI_RERANK, request, SCORES, "ce", 9, "job-1"))
    # Ties keep the documents' order.
    assert [r["index"] for r in out] == [1, 3, 2, 0]
    assert [r["score"] for r in out] == pytest.approx([0.9, 0.9, 0.5, 0.1])
    assert all("text" not in r for r in out)


def test_tei_rerank_return_text() -> None:
    request = RerankRequest(query="q", documents=DOCS, return_documents=True)
    out = reply(codecs.encode(TEI_RERANK, request, SCORES, "ce", 9, "job-1"))
    assert [r["text"] for r in out] == ["one", "three", "two", "zero"]


def test_cohere_rerank_reply_with_top_n() -> None:
    request = RerankRequest(query="q", documents=DOCS, top_n=2)
    out = reply(codecs.encode(COHERE, request, SCORES, "ce", 9, "job-1"))
    assert out["id"] == "job-1"
    assert out["model"] == "ce"
    assert out["usage"] == {"total_tokens": 9}
    assert [r["index"] for r in out["results"]] == [1, 3]
    assert [r["relevance_score"] for r in out["results"]] == pytest.approx([0.9, 0.9])
    assert all("document" not in r for r in out["results"])


def test_cohere_rerank_top_n_over_the_documents_returns_all() -> None:
    request = RerankRequest(query="q", documents=DOCS, top_n=10)
    out = reply(codecs.encode(COHERE, request, SCORES, "ce", 9, "job-1"))
    assert len(out["results"]) == 4


def test_cohere_rerank_return_documents() -> None:
    raw = body({"query": "q", "documents": ["zero", {"text": "one"}], "return_documents": True})
    request = codecs.decode(COHERE, raw, LIMITS)
    scores = np.asarray([0.2, 0.7], dtype=np.float32)
    out = reply(codecs.encode(COHERE, request, scores, "ce", 4, "job-2"))
    assert [r["document"] for r in out["results"]] == [{"text": "one"}, {"text": "zero"}]
