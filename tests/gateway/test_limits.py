"""The edges of the HTTP surface, in-process: parser limits (deep nesting), unknown routes
and methods, empty inputs, truncation of inputs of any length; each error in the route's
documented shape with a message that says what to change."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from embedder.core.jobs import TruncationSide
from embedder.core.rawjson import MAX_DEPTH
from embedder.tasks.embed.runtimes import Encoded
from flotilla.settings import Settings
from gateway.app import body_routes
from ingest.store.qdrant import QdrantStore
from tests.gateway import expected
from tests.gateway.conftest import FAKE_MAX_TOKENS, Stack
from tests.gateway.live import live_server

BODY_ROUTES = list(body_routes())


def error_of(response: httpx.Response) -> tuple[str, str]:
    """(type, message) of an error answer, checking the shape its route documents: the
    OpenAI shape under /v1/ and /v2/, TEI's elsewhere."""
    body = response.json()
    if response.request.url.path.startswith(("/v1/", "/v2/")):
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "code"}, body
        assert body["error"]["code"] == response.status_code
        return body["error"]["type"], body["error"]["message"]
    assert set(body) == {"error", "error_type"}, body
    return body["error_type"], body["error"]


def nested(depth: int) -> bytes:
    return b'{"model": "alpha", "input": ' + b"[" * depth + b"]" * depth + b"}"


# -- parser limits ---------------------------------------------------------------------


@pytest.mark.parametrize("path", BODY_ROUTES)
async def test_deep_nesting_is_422_on_every_route(stack: Stack, path: str) -> None:
    # 2 KB of brackets took the decoder past Python's recursion limit: a 500 everywhere.
    for depth in (MAX_DEPTH + 1, 5_000, 200_000):
        response = await stack.client.post(path, content=nested(depth))
        assert response.status_code == 422, response.text
        kind, message = error_of(response)
        assert kind == "invalid_request"
        assert f"nests {depth + 1} levels deep" in message
        assert f"more than the {MAX_DEPTH} accepted" in message
    assert not stack.queue.jobs  # refused before anything decoded it or queued a job


def test_search_route_refuses_deep_nesting_too() -> None:
    body = b'{"query": "q", "filter": {"a": ' + b"[" * 3000 + b"]" * 3000 + b"}}"
    with live_server(store=QdrantStore(location=":memory:")) as live:
        response = httpx.post(f"{live.url}/v1/collections/laws/search", content=body)
    assert response.status_code == 422, response.text
    assert "levels deep" in error_of(response)[1]


async def test_nesting_within_the_limit_reaches_the_worker(stack: Stack) -> None:
    # Deep but within the limit, and brackets inside strings never count.
    text = "[[[[" * 100 + "{{{{" * 100
    body = {"model": "alpha", "input": [text], "extra": [[[[[[[[[[{"x": 1}]]]]]]]]]]}
    response = await stack.client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(
        expected.openai_vectors(response.json())[0],
        expected.embedding(stack.runtime("alpha"), text),
        rtol=1e-5,
        atol=1e-6,
    )


# -- unknown routes and methods ----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/nope"), ("POST", "/v3/embed"), ("GET", "/v1/nope"), ("POST", "/v2/embedding")],
)
async def test_unknown_route_is_404_in_the_documented_shape(
    stack: Stack, method: str, path: str
) -> None:
    response = await stack.client.request(method, path, content=b"{}")
    assert response.status_code == 404
    kind, message = error_of(response)
    assert kind == "not_found"
    assert f"no route {method} {path}" in message
    assert "POST /v1/embeddings" in message and "/openapi.json" in message


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/embed", "POST"),
        ("PUT", "/", "POST"),
        ("GET", "/v1/rerank", "POST"),
        ("GET", "/v2/embed", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", "/health", "GET"),
    ],
)
async def test_wrong_method_is_405_with_allow(
    stack: Stack, method: str, path: str, allow: str
) -> None:
    response = await stack.client.request(method, path)
    assert response.status_code == 405
    assert allow in response.headers["allow"]
    kind, message = error_of(response)
    assert kind == "method_not_allowed"
    assert f"{path} does not take {method}" in message and allow in message


# -- empty inputs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "named"),
    [
        ("/v1/embeddings", {"model": "alpha", "input": ""}, "'input' is empty"),
        ("/v1/embeddings", {"model": "alpha", "input": ["ok", " \t\n "]}, "'input' item 1"),
        ("/embed", {"inputs": ["a", "b", "", "d"]}, "'inputs' item 2"),
        ("/", {"inputs": "   "}, "'inputs' is empty"),
        ("/rerank", {"query": " ", "texts": ["a"]}, "'query' is empty"),
        ("/rerank", {"query": "q", "texts": ["a", "\u3000"]}, "'texts' item 1"),
        ("/v1/rerank", {"query": "q", "documents": [{"text": ""}]}, "'documents' item 0"),
        ("/v1/rerank", {"query": "", "documents": ["a"]}, "'query' is empty"),
        ("/v2/embed", {"texts": ["a", " "], "input_type": "search_query"}, "'texts' item 1"),
        ("/v2/rerank", {"query": "\n", "documents": ["a"]}, "'query' is empty"),
        ("/v2/rerank", {"query": "q", "documents": ["a", ""]}, "'documents' item 1"),
        (
            "/similarity",
            {"inputs": {"source_sentence": " ", "sentences": ["a"]}},
            "'source_sentence' is empty",
        ),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": [""]}}, "item 0"),
    ],
)
async def test_empty_or_whitespace_inputs_are_422_naming_the_input(
    stack: Stack, path: str, body: object, named: str
) -> None:
    response = await stack.client.post(path, json=body)
    assert response.status_code == 422, response.text
    kind, message = error_of(response)
    assert kind == "invalid_request"
    assert named in message and "only whitespace" in message


# -- truncation of inputs of any length ------------------------------------------------------


async def test_truncate_cuts_an_input_of_any_length_up_to_the_body_limit(stack: Stack) -> None:
    # 1.5 MB of text (over 262 KB: admission refused it at its estimated full length).
    words = [f"w{i}" for i in range(300_000)]
    text = " ".join(words)
    assert 1_000_000 < len(text) < Settings().gateway.max_body_bytes
    runtime = stack.runtime("alpha")
    seen: list[int] = []
    tokenize = runtime.tokenize

    def recording(texts: list[str], side: TruncationSide, prefix: str = "") -> Encoded:
        seen.extend(len(t) for t in texts)
        return tokenize(texts, side, prefix)

    runtime.tokenize = recording  # type: ignore[method-assign]
    for side in ("right", "left"):
        start = time.perf_counter()
        response = await stack.client.post(
            "/embed", json={"inputs": [text], "truncate": True, "truncation_direction": side}
        )
        assert response.status_code == 200, response.text
        assert time.perf_counter() - start < 5
        assert int(response.headers["x-prompt-tokens"]) == FAKE_MAX_TOKENS
        kept = words[: FAKE_MAX_TOKENS - 2] if side == "right" else words[2 - FAKE_MAX_TOKENS :]
        np.testing.assert_allclose(
            response.json()[0],
            expected.embedding(runtime, " ".join(kept)),
            rtol=1e-5,
            atol=1e-6,
        )
    assert max(seen) < 10_000  # cut before tokenizing, not after
    # The job was sized at the window, not at 1.5 MB of text.
    assert stack.queue.jobs[-1][0].est_tokens < 100


async def test_truncate_on_rerank_keeps_the_text_it_returns_whole(stack: Stack) -> None:
    long_doc = " ".join(f"d{i}" for i in range(100_000))
    response = await stack.client.post(
        "/rerank",
        json={"query": "q", "texts": [long_doc, "short"], "truncate": True, "return_text": True},
    )
    assert response.status_code == 200, response.text
    texts = {item["index"]: item["text"] for item in response.json()}
    assert texts[0] == long_doc


async def test_without_truncate_a_long_input_is_413_naming_the_window(stack: Stack) -> None:
    text = " ".join(f"w{i}" for i in range(100_000))
    response = await stack.client.post("/embed", content=json.dumps({"inputs": text}))
    assert response.status_code == 413
    kind, message = error_of(response)
    assert kind == "limit_exceeded"
    assert f"limit of {FAKE_MAX_TOKENS}" in message and '"truncate": true' in message
    assert "--max-inflight-tokens" not in message  # the model's window, not admission
