"""The HTTP surface, in-process: every route and every error class, against fake models
whose answers the test computes on its own (tests/gateway/expected.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flotilla.settings import Settings
from tests.fakes import FakeRuntime
from tests.gateway import expected
from tests.gateway.conftest import FAKE_MAX_TOKENS, Loader, Stack, StackFactory

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "hello"]
LONG_TEXT = " ".join(f"word{i}" for i in range(FAKE_MAX_TOKENS + 10))  # over the token limit
ALL_MODELS = "alpha, beta, gamma, judge"


def openai_error(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict)
    assert set(error) == {"message", "type", "code"}
    assert error["code"] == response.status_code
    return error


def tei_error(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body) == {"error", "error_type"}, body
    assert isinstance(body["error"], str)
    return body


# -- the four routes ---------------------------------------------------------------


async def test_openai_embeddings_float(stack: Stack) -> None:
    response = await stack.client.post("/v1/embeddings", json={"model": "beta", "input": TEXTS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == "beta"
    tokens = expected.prompt_tokens(TEXTS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    np.testing.assert_allclose(
        expected.openai_vectors(body),
        expected.embeddings(stack.runtime("beta"), TEXTS),
        rtol=1e-5,
        atol=1e-6,
    )


async def test_openai_embeddings_single_string_and_alias(stack: Stack) -> None:
    response = await stack.client.post(
        "/v1/embeddings", json={"model": "org/alpha", "input": "a lone string"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "alpha"  # the alias resolves to the model's own name
    np.testing.assert_allclose(
        expected.openai_vectors(body),
        expected.embeddings(stack.runtime("alpha"), ["a lone string"]),
        rtol=1e-5,
        atol=1e-6,
    )


async def test_openai_embeddings_base64_is_exact_little_endian_float32(stack: Stack) -> None:
    floats = await stack.client.post("/v1/embeddings", json={"model": "alpha", "input": TEXTS})
    packed = await stack.client.post(
        "/v1/embeddings", json={"model": "alpha", "input": TEXTS, "encoding_format": "base64"}
    )
    assert packed.status_code == 200, packed.text
    items = packed.json()["data"]
    assert all(isinstance(item["embedding"], str) for item in items)
    vectors = expected.openai_vectors(packed.json())
    assert vectors.shape == (3, 8)
    np.testing.assert_array_equal(vectors, expected.openai_vectors(floats.json()))


async def test_openai_embeddings_dimensions_cut_then_renormalize(stack: Stack) -> None:
    response = await stack.client.post(
        "/v1/embeddings", json={"model": "alpha", "input": TEXTS, "dimensions": 3}
    )
    assert response.status_code == 200, response.text
    vectors = expected.openai_vectors(response.json())
    assert vectors.shape == (3, 3)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(
        vectors,
        expected.embeddings(stack.runtime("alpha"), TEXTS, dimensions=3),
        rtol=1e-5,
        atol=1e-6,
    )


async def test_tei_embed(stack: Stack) -> None:
    # No model field: TEI routes use the fleet's first embedding model.
    response = await stack.client.post("/embed", json={"inputs": TEXTS})
    assert response.status_code == 200, response.text
    assert response.headers["x-model"] == "alpha"
    np.testing.assert_allclose(
        np.asarray(response.json()),
        expected.embeddings(stack.runtime("alpha"), TEXTS),
        rtol=1e-5,
        atol=1e-6,
    )


async def test_tei_embed_unnormalized_dimensions_and_model_field(stack: Stack) -> None:
    response = await stack.client.post(
        "/embed", json={"model": "gamma", "inputs": "one text", "normalize": False, "dimensions": 5}
    )
    assert response.status_code == 200, response.text
    got = np.asarray(response.json())
    assert got.shape == (1, 5)
    want = expected.embedding(stack.runtime("gamma"), "one text", normalize=False, dimensions=5)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    assert abs(np.linalg.norm(got[0]) - 1.0) > 1e-3  # really left unnormalized


async def test_tei_rerank_with_cross_encoder(stack: Stack) -> None:
    query, docs = "what is a fox", ["a fox is an animal", "tax law", "the weather today"]
    response = await stack.client.post(
        "/rerank", json={"query": query, "texts": docs, "return_text": True}
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-model"] == "judge"  # the fleet's reranker, by default
    runtime = stack.runtime("judge")
    want = {i: expected.cross_score(runtime, query, d) for i, d in enumerate(docs)}
    results = response.json()
    assert [r["index"] for r in results] == sorted(want, key=lambda i: -want[i])
    for r in results:
        assert r["score"] == pytest.approx(want[r["index"]], rel=1e-5)
        assert r["text"] == docs[r["index"]]
        assert 0.0 < r["score"] < 1.0


async def test_tei_rerank_raw_scores_are_logits(stack: Stack) -> None:
    query, docs = "q", ["first doc", "second doc"]
    response = await stack.client.post(
        "/rerank", json={"query": query, "texts": docs, "raw_scores": True}
    )
    assert response.status_code == 200, response.text
    runtime = stack.runtime("judge")
    got = {r["index"]: r["score"] for r in response.json()}
    assert "text" not in response.json()[0]
    for i, doc in enumerate(docs):
        assert got[i] == pytest.approx(expected.cross_logit(runtime, query, doc), rel=1e-5)


async def test_cohere_rerank_top_n_and_documents(stack: Stack) -> None:
    query = "capital of france"
    docs = ["paris is the capital", {"text": "berlin is in germany"}, "bread", "cheese"]
    texts = [d if isinstance(d, str) else d["text"] for d in docs]
    response = await stack.client.post(
        "/v1/rerank",
        json={
            "model": "judge",
            "query": query,
            "documents": docs,
            "top_n": 2,
            "return_documents": True,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "judge"
    assert body["id"] == response.headers["x-request-id"]
    assert body["usage"]["total_tokens"] == expected.prompt_tokens([f"{query} {t}" for t in texts])
    runtime = stack.runtime("judge")
    want = [expected.cross_score(runtime, query, t) for t in texts]
    top = sorted(range(len(texts)), key=lambda i: -want[i])[:2]
    assert [r["index"] for r in body["results"]] == top
    for r in body["results"]:
        assert r["relevance_score"] == pytest.approx(want[r["index"]], rel=1e-5)
        assert r["document"] == {"text": texts[r["index"]]}


async def test_cohere_rerank_with_embedding_model_scores_by_cosine(stack: Stack) -> None:
    query, docs = "a fox", ["a quick fox", "slow tax law", "fox"]
    response = await stack.client.post(
        "/v1/rerank", json={"model": "beta", "query": query, "documents": docs}
    )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert len(results) == 3  # no top_n: every document
    assert all("document" not in r for r in results)
    runtime = stack.runtime("beta")
    for r in results:
        want = expected.cosine_score(runtime, query, docs[r["index"]])
        assert r["relevance_score"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)


# -- models and probes ------------------------------------------------------------


async def test_models_lists_the_fleet_with_state(stack: Stack) -> None:
    response = await stack.client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    models = {m["id"]: m for m in body["data"]}
    assert sorted(models) == ["alpha", "beta", "gamma", "judge"]
    assert all(m["state"] == "ready" and m["object"] == "model" for m in models.values())
    assert models["alpha"]["aliases"] == ["org/alpha"]
    assert models["alpha"]["task"] == "embed"
    assert models["alpha"]["kind"] == "bi-encoder"
    assert models["alpha"]["dimension"] == 8
    assert models["judge"]["task"] == "rerank"
    assert models["judge"]["kind"] == "cross-encoder"
    assert models["judge"]["max_tokens"] == FAKE_MAX_TOKENS


async def test_health_and_ready(stack: Stack) -> None:
    health = await stack.client.get("/health")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ready = await stack.client.get("/ready")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    assert set(ready.json()["models"].values()) == {"ready"}


async def test_not_ready_while_loading_then_ready(make_stack: StackFactory) -> None:
    gate = threading.Event()
    async with make_stack(loader=Loader(load_gate=gate), wait_ready=False) as s:
        health = await s.client.get("/health")
        assert health.status_code == 200  # alive while loading

        ready = await s.client.get("/ready")
        assert ready.status_code == 503
        assert ready.json() == {
            "status": "not_ready",
            "models": dict.fromkeys(["alpha", "beta", "gamma", "judge"], "loading"),
        }
        models = (await s.client.get("/v1/models")).json()["data"]
        assert {m["state"] for m in models} == {"loading"}

        for path, body in [
            ("/v1/embeddings", {"model": "alpha", "input": "x"}),
            ("/embed", {"inputs": "x"}),
        ]:
            response = await s.client.post(path, json=body)
            assert response.status_code == 503
            assert int(response.headers["retry-after"]) > 0
            assert "loading" in response.text
        assert s.queue.jobs == []  # refused before the queue

        gate.set()
        await asyncio.wait_for(s.host.wait_ready(), 10)
        assert (await s.client.get("/ready")).status_code == 200
        response = await s.client.post("/v1/embeddings", json={"model": "alpha", "input": "x"})
        assert response.status_code == 200


async def test_a_model_that_fails_to_load_is_reported_and_the_rest_serve(
    make_stack: StackFactory,
) -> None:
    async with make_stack(loader=Loader(fail=frozenset({"beta"}))) as s:
        ready = await s.client.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["models"]["beta"] == "failed"
        models = {m["id"]: m for m in (await s.client.get("/v1/models")).json()["data"]}
        assert models["beta"]["state"] == "failed"
        assert "corrupt" in models["beta"]["error"]

        broken = await s.client.post("/v1/embeddings", json={"model": "beta", "input": "x"})
        assert broken.status_code == 503
        assert "failed to load" in openai_error(broken)["message"]
        assert broken.headers["retry-after"] == "60"

        fine = await s.client.post("/v1/embeddings", json={"model": "alpha", "input": "x"})
        assert fine.status_code == 200


# -- refusals ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": "nope", "input": "x"}),
        ("/v1/rerank", {"model": "nope", "query": "q", "documents": ["d"]}),
    ],
)
async def test_unknown_model_openai_shape(stack: Stack, path: str, body: object) -> None:
    response = await stack.client.post(path, json=body)
    assert response.status_code == 404
    error = openai_error(response)
    assert error["type"] == "model_not_found"
    assert "'nope'" in str(error["message"])
    assert ALL_MODELS in str(error["message"])


@pytest.mark.parametrize("name", ["", " ", "\t", ":", "-", "...", "alpha ", " alpha"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"input": "x"}),
        ("/v1/rerank", {"query": "q", "documents": ["d"]}),
        ("/embed", {"inputs": "x"}),
    ],
)
async def test_a_blank_or_punctuation_model_is_404_never_the_default(
    stack: Stack, path: str, body: dict[str, object], name: str
) -> None:
    response = await stack.client.post(path, json={**body, "model": name})
    assert response.status_code == 404, response.text
    assert ALL_MODELS in response.text  # the message lists the fleet
    assert stack.queue.jobs == []  # nothing was answered by the default model


async def test_an_empty_adapter_after_the_colon_is_refused_not_the_base(stack: Stack) -> None:
    response = await stack.client.post("/v1/embeddings", json={"model": "alpha:", "input": "x"})
    assert response.status_code == 404, response.text
    assert "adapter ''" in str(openai_error(response)["message"])
    assert stack.queue.jobs == []


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", {"model": "nope", "inputs": "x"}),
        ("/rerank", {"model": "nope", "query": "q", "texts": ["d"]}),
    ],
)
async def test_unknown_model_tei_shape(stack: Stack, path: str, body: object) -> None:
    response = await stack.client.post(path, json=body)
    assert response.status_code == 404
    error = tei_error(response)
    assert error["error_type"] == "model_not_found"
    assert ALL_MODELS in str(error["error"])


async def test_embedding_with_a_reranker_names_the_embedding_models(stack: Stack) -> None:
    response = await stack.client.post("/v1/embeddings", json={"model": "judge", "input": "x"})
    assert response.status_code == 400
    error = openai_error(response)
    assert error["type"] == "task_not_supported"
    assert "alpha, beta, gamma" in str(error["message"])


async def test_unknown_adapter_is_404(stack: Stack) -> None:
    response = await stack.client.post(
        "/v1/embeddings", json={"model": "alpha:lora1", "input": "x"}
    )
    assert response.status_code == 404
    assert "'lora1'" in str(openai_error(response)["message"])


async def test_body_over_max_body_bytes(make_stack: StackFactory) -> None:
    async with make_stack(Settings(max_body_bytes=1000)) as s:
        big = json.dumps({"model": "alpha", "input": "x" * 2000})
        response = await s.client.post("/v1/embeddings", content=big)
        assert response.status_code == 413
        error = openai_error(response)
        assert error["type"] == "limit_exceeded"
        assert "--max-body-bytes" in str(error["message"])

        async def chunks():  # chunked: no content-length to trust, the stream is counted
            for _ in range(10):
                yield b" " * 300

        streamed = await s.client.post("/embed", content=chunks())
        assert "content-length" not in streamed.request.headers
        assert streamed.status_code == 413
        assert "--max-body-bytes" in tei_error(streamed)["error"]

        # Exactly at the limit passes (JSON whitespace pads it).
        body = b'{"model": "alpha", "input": "fits"}'
        exact = await s.client.post("/v1/embeddings", content=body + b" " * (1000 - len(body)))
        assert exact.status_code == 200, exact.text
        assert s.queue.jobs[-1][0].body.startswith(body)
        assert len(s.queue.jobs) == 1  # the refused bodies never reached the queue


async def test_too_many_inputs(make_stack: StackFactory) -> None:
    async with make_stack(Settings(max_inputs_per_request=4)) as s:
        response = await s.client.post(
            "/v1/embeddings", json={"model": "alpha", "input": ["a", "b", "c", "d", "e"]}
        )
        assert response.status_code == 413
        message = str(openai_error(response)["message"])
        assert "--max-inputs-per-request" in message
        assert "5" in message and "4" in message

        docs = await s.client.post("/rerank", json={"query": "q", "texts": ["a"] * 5})
        assert docs.status_code == 413
        assert "--max-inputs-per-request" in tei_error(docs)["error"]

        ok = await s.client.post("/v1/embeddings", json={"model": "alpha", "input": ["a"] * 4})
        assert ok.status_code == 200


async def test_input_over_max_tokens_413_unless_truncated(stack: Stack) -> None:
    response = await stack.client.post(
        "/v1/embeddings", json={"model": "alpha", "input": ["short", LONG_TEXT]}
    )
    assert response.status_code == 413
    message = str(openai_error(response)["message"])
    assert f"limit of {FAKE_MAX_TOKENS}" in message
    assert "input 1" in message
    assert "--auto-truncate" in message

    tei = await stack.client.post("/embed", json={"inputs": LONG_TEXT})
    assert tei.status_code == 413
    assert '"truncate": true' in tei_error(tei)["error"]

    runtime = stack.runtime("alpha")
    right = await stack.client.post("/embed", json={"inputs": LONG_TEXT, "truncate": True})
    assert right.status_code == 200, right.text
    assert int(right.headers["x-prompt-tokens"]) == FAKE_MAX_TOKENS
    np.testing.assert_allclose(
        right.json()[0], expected.embedding(runtime, LONG_TEXT), rtol=1e-5, atol=1e-6
    )

    left = await stack.client.post(
        "/embed",
        json={"inputs": LONG_TEXT, "truncate": True, "truncation_direction": "Left"},
    )
    assert left.status_code == 200, left.text
    ids = FakeRuntime.word_ids(LONG_TEXT)
    kept = [ids[0], *ids[len(ids) - FAKE_MAX_TOKENS + 1 : -1], ids[-1]]
    assert len(kept) == FAKE_MAX_TOKENS
    want = runtime.vector_of_ids(kept)
    np.testing.assert_allclose(left.json()[0], want / np.linalg.norm(want), rtol=1e-5, atol=1e-6)
    assert not np.allclose(left.json()[0], right.json()[0])


async def test_auto_truncate_setting_covers_openai_requests(make_stack: StackFactory) -> None:
    async with make_stack(Settings(auto_truncate=True)) as s:
        response = await s.client.post(
            "/v1/embeddings", json={"model": "alpha", "input": LONG_TEXT}
        )
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(
            expected.openai_vectors(response.json())[0],
            expected.embedding(s.runtime("alpha"), LONG_TEXT),
            rtol=1e-5,
            atol=1e-6,
        )


@pytest.mark.parametrize(
    ("path", "content", "hint"),
    [
        ("/v1/embeddings", b"", "empty"),
        ("/embed", b"", "empty"),
        ("/v1/embeddings", b"{not json", "not valid JSON"),
        ("/rerank", b'{"query": "q", "texts": [', "not valid JSON"),
        ("/rerank", b"[1, 2]", "Expected `object`"),
        ("/v1/embeddings", b'{"model": 5, "input": "x"}', "model"),  # caught by the gateway
        ("/v1/embeddings", b'{"model": "alpha", "input": 5}', "input"),  # by the worker
        ("/v1/embeddings", b'{"model": "alpha"}', "input"),
        ("/v1/embeddings", b'{"model": "alpha", "input": []}', "must not be empty"),
        ("/embed", b'{"inputs": ["a", 3]}', "inputs"),
        ("/embed", b'{"inputs": "a", "dimensions": 0}', "dimensions"),
        ("/embed", b'{"inputs": "a", "dimensions": 9}', "8 or fewer"),
        ("/rerank", b'{"texts": ["a"]}', "query"),
        ("/v1/rerank", b'{"query": "q", "documents": ["a"], "top_n": 0}', "top_n"),
        ("/v1/embeddings", b'{"model": "alpha", "input": "x", "encoding_format": "hex"}', "hex"),
    ],
)
async def test_bad_bodies_are_422_with_a_useful_message(
    stack: Stack, path: str, content: bytes, hint: str
) -> None:
    response = await stack.client.post(path, content=content)
    assert response.status_code == 422, response.text
    if path.startswith("/v1/"):
        error = openai_error(response)
        assert error["type"] == "invalid_request"
        message = str(error["message"])
    else:
        error = tei_error(response)
        assert error["error_type"] == "invalid_request"
        message = str(error["error"])
    assert hint in message


@pytest.mark.parametrize(
    ("header", "value", "hint"),
    [
        ("x-request-timeout-ms", "soon", "x-request-timeout-ms"),
        ("x-request-timeout-ms", "-5", "x-request-timeout-ms must be a finite positive"),
        ("x-request-timeout-ms", "0", "x-request-timeout-ms must be a finite positive"),
        ("x-request-timeout-ms", "nan", "x-request-timeout-ms must be a finite positive"),
        ("x-request-timeout-ms", "inf", "x-request-timeout-ms must be a finite positive"),
        ("x-request-timeout-ms", "-inf", "x-request-timeout-ms must be a finite positive"),
        ("x-request-timeout-ms", "1e400", "x-request-timeout-ms must be a finite positive"),
        ("x-priority", "high", "x-priority"),
    ],
)
async def test_bad_headers_are_422(stack: Stack, header: str, value: str, hint: str) -> None:
    response = await stack.client.post(
        "/v1/embeddings", json={"model": "alpha", "input": "x"}, headers={header: value}
    )
    assert response.status_code == 422
    assert hint in str(openai_error(response)["message"])


async def test_api_keys(make_stack: StackFactory) -> None:
    async with make_stack(Settings(api_keys="key-one, key-two")) as s:
        body = {"model": "alpha", "input": "x"}
        for headers in [{}, {"authorization": "Bearer wrong"}, {"authorization": "Basic key-one"}]:
            response = await s.client.post("/v1/embeddings", json=body, headers=headers)
            assert response.status_code == 401, headers
            assert response.headers["www-authenticate"] == "Bearer"
            assert "API key" in str(openai_error(response)["message"])
        tei = await s.client.post("/embed", json={"inputs": "x"})
        assert tei.status_code == 401
        assert tei_error(tei)["error_type"] == "unauthorized"
        assert s.queue.jobs == []  # refused before reading further

        for key in ("key-one", "key-two"):
            response = await s.client.post(
                "/v1/embeddings", json=body, headers={"authorization": f"Bearer {key}"}
            )
            assert response.status_code == 200, response.text
        assert (await s.client.get("/health")).status_code == 200  # probes stay open


async def test_deadline_gives_504_at_the_deadline(make_stack: StackFactory) -> None:
    # 12 tokens at 50 ms each: the forward takes 600 ms, the client allows 50.
    async with make_stack(loader=Loader(seconds_per_token=0.05)) as s:
        text = "one two three four five six seven eight nine ten"
        start = time.perf_counter()
        response = await s.client.post(
            "/v1/embeddings",
            json={"model": "alpha", "input": text},
            headers={"x-request-timeout-ms": "50"},
        )
        elapsed = time.perf_counter() - start
        assert response.status_code == 504
        error = openai_error(response)
        assert error["type"] == "deadline_exceeded"
        assert "x-request-timeout-ms" in str(error["message"])
        assert elapsed < 0.5  # answered at the deadline, not after the forward pass
        _, future = s.queue.jobs[-1]
        assert future.cancelled()  # withdrawn, so a worker that has not started skips it

        later = await s.client.post("/v1/embeddings", json={"model": "alpha", "input": "ok"})
        assert later.status_code == 200


async def test_server_timeout_caps_the_client_header(make_stack: StackFactory) -> None:
    settings = Settings(request_timeout_s=0.05)
    async with make_stack(settings, loader=Loader(seconds_per_token=0.02)) as s:
        response = await s.client.post(
            "/embed",
            json={"inputs": "one two three four five six seven eight nine ten"},
            headers={"x-request-timeout-ms": "60000"},
        )
        assert response.status_code == 504
        assert tei_error(response)["error_type"] == "deadline_exceeded"
        assert "--request-timeout-s" in tei_error(response)["error"]


# -- observability ----------------------------------------------------------------


def sample(text: str, name: str, **labels: str) -> float:
    """One sample's value from a Prometheus exposition; 0 when absent."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


async def test_metrics(stack: Stack) -> None:
    before = (await stack.client.get("/metrics")).text
    response = await stack.client.post("/v1/embeddings", json={"model": "gamma", "input": TEXTS})
    assert response.status_code == 200
    scrape = await stack.client.get("/metrics")
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain")
    after = scrape.text

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    tokens = expected.prompt_tokens(TEXTS)
    assert delta("flotilla_tokens_total", model="gamma") == tokens
    assert delta("flotilla_batch_tokens_count", model="gamma") == 1
    assert delta("flotilla_batch_tokens_sum", model="gamma") == tokens
    assert delta("flotilla_request_seconds_count", model="gamma", route="/v1/embeddings") == 1
    assert (
        delta("flotilla_requests_total", model="gamma", route="/v1/embeddings", status="200") == 1
    )
    assert delta("flotilla_queue_seconds_count", model="gamma") == 1
    for model in ("alpha", "beta", "gamma", "judge"):
        assert f'flotilla_queue_depth{{model="{model}"}} 0.0' in after
    assert sample(after, "flotilla_inflight_tokens", model="gamma") == 0


async def test_errors_are_counted_by_status(stack: Stack) -> None:
    def count(text: str) -> float:
        return sample(text, "flotilla_requests_total", model="alpha", route="/embed", status="413")

    before = count((await stack.client.get("/metrics")).text)
    response = await stack.client.post("/embed", json={"inputs": LONG_TEXT})
    assert response.status_code == 413
    assert count((await stack.client.get("/metrics")).text) == before + 1


async def test_timing_headers(stack: Stack) -> None:
    response = await stack.client.post("/v1/embeddings", json={"model": "alpha", "input": TEXTS})
    assert response.status_code == 200
    headers = response.headers
    for name in ("x-queue-time", "x-inference-time", "x-total-time"):
        assert float(headers[name]) >= 0.0, name
    assert float(headers["x-total-time"]) >= float(headers["x-queue-time"])
    assert int(headers["x-prompt-tokens"]) == expected.prompt_tokens(TEXTS)
    assert headers["x-model"] == "alpha"
    assert len(headers["x-request-id"]) == 32
    assert headers["x-request-id"] == stack.queue.jobs[-1][0].id
