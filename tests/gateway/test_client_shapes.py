"""The routes of Cohere v2 and TEI's similarity, in-process: routing, default models, the
error shape of each, the headers every route sends."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gateway import expected
from tests.gateway.conftest import Stack
from tests.gateway.test_api import openai_error, tei_error

SIMILARITY = {"inputs": {"source_sentence": "a fox", "sentences": ["a quick fox", "tax law"]}}


async def test_v2_embed_route(stack: Stack) -> None:
    body = {"model": "beta", "texts": ["a b", "c"], "input_type": "search_query"}
    response = await stack.client.post("/v2/embed", json={**body, "embedding_types": ["float"]})
    assert response.status_code == 200, response.text
    assert response.headers["x-model"] == "beta"
    got = response.json()
    assert got["id"] == response.headers["x-request-id"]
    np.testing.assert_allclose(
        got["embeddings"]["float"],
        expected.embeddings(stack.runtime("beta"), ["a b", "c"]),
        rtol=1e-5,
    )
    assert got["meta"]["billed_units"]["input_tokens"] == expected.prompt_tokens(["a b", "c"])


async def test_v2_rerank_route_defaults_to_the_reranker(stack: Stack) -> None:
    docs = ["paris is the capital", "bread"]
    response = await stack.client.post("/v2/rerank", json={"query": "capital", "documents": docs})
    assert response.status_code == 200, response.text
    assert response.headers["x-model"] == "judge"
    runtime = stack.runtime("judge")
    want = [expected.cross_score(runtime, "capital", d) for d in docs]
    results = response.json()["results"]
    assert [r["index"] for r in results] == sorted(range(2), key=lambda i: -want[i])
    assert results[0]["relevance_score"] == pytest.approx(max(want), rel=1e-5)


@pytest.mark.parametrize("path", ["/similarity", "/"])
async def test_similarity_routes(stack: Stack, path: str) -> None:
    response = await stack.client.post(path, json={**SIMILARITY, "model": "gamma"})
    assert response.status_code == 200, response.text
    runtime = stack.runtime("gamma")
    want = [expected.cosine_score(runtime, "a fox", t) for t in SIMILARITY["inputs"]["sentences"]]
    assert response.json() == pytest.approx(want, rel=1e-5, abs=1e-6)


async def test_root_embeds_with_the_first_embedding_model(stack: Stack) -> None:
    response = await stack.client.post("/", json={"inputs": ["a b"]})
    assert response.status_code == 200, response.text
    assert response.headers["x-model"] == "alpha"
    np.testing.assert_allclose(
        response.json(), expected.embeddings(stack.runtime("alpha"), ["a b"]), rtol=1e-5
    )


async def test_v2_errors_are_in_the_openai_shape(stack: Stack) -> None:
    missing = await stack.client.post("/v2/embed", json={"model": "nope", "texts": ["a"]})
    assert missing.status_code == 404
    assert "alpha" in str(openai_error(missing)["message"])
    bad = await stack.client.post("/v2/rerank", json={"query": "q", "documents": []})
    assert bad.status_code == 422
    assert "'documents' must not be empty" in str(openai_error(bad)["message"])


async def test_similarity_with_a_reranker_names_the_embedding_models(stack: Stack) -> None:
    response = await stack.client.post("/similarity", json={**SIMILARITY, "model": "judge"})
    assert response.status_code == 400
    assert "alpha, beta, gamma" in str(tei_error(response)["error"])


async def test_openai_token_ids_are_a_422_in_the_openai_shape(stack: Stack) -> None:
    response = await stack.client.post("/v1/embeddings", json={"model": "alpha", "input": [[1, 2]]})
    assert response.status_code == 422
    assert "check_embedding_ctx_length=False" in str(openai_error(response)["message"])
