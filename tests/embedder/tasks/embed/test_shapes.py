"""The shapes beyond OpenAI/TEI/Cohere v1, through run_batch with fakes whose answers the
test computes itself: Cohere v2 embed and rerank, TEI similarity and its root, and the
OpenAI route's answer to token ids."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from embedder.core.errors import FlotillaError, InvalidRequest, LimitExceeded
from embedder.core.jobs import ApiShape
from tests.embedder.tasks.embed.test_execute import body_of, job, run, runtime, sigmoid

ALL_TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
TEXTS = ["the tenant returns the keys", "a b c", "one"]
LONG = " ".join(f"w{i}" for i in range(30))  # over the fakes' 16-token window


def error_of(outcome: object, kind: type[FlotillaError] = InvalidRequest) -> str:
    assert isinstance(outcome, kind), outcome
    return outcome.message


def v2_embed(fake: Any, **payload: object) -> dict[str, Any]:
    out = run(fake, job("v2", ApiShape.COHERE_EMBED_V2, {"model": "model", **payload}))["v2"]
    return body_of(out)  # type: ignore[no-any-return]


def test_v2_embed_every_type_from_the_same_unit_vectors() -> None:
    fake = runtime()
    body = v2_embed(fake, texts=TEXTS, input_type="search_document", embedding_types=ALL_TYPES)
    assert body["id"] == "v2"
    assert body["response_type"] == "embeddings_by_type"
    assert body["texts"] == TEXTS
    tokens = sum(len(fake.word_ids(t)) for t in TEXTS)
    assert body["meta"] == {
        "api_version": {"version": "2"},
        "billed_units": {"input_tokens": tokens},
    }
    got = body["embeddings"]
    assert list(got) == ALL_TYPES
    floats = np.asarray(got["float"], dtype=np.float32)
    want = np.stack([fake.expected_vector(t) for t in TEXTS])
    np.testing.assert_allclose(floats, want, rtol=1e-5, atol=1e-6)
    assert got["int8"] == [[round(float(v) * 127) for v in row] for row in floats]
    assert got["uint8"] == [[v + 128 for v in row] for row in got["int8"]]
    bits = [[int("".join("1" if v > 0 else "0" for v in row[:8]), 2)] for row in floats]
    assert got["ubinary"] == bits  # the fakes' 8 dimensions make one byte
    assert got["binary"] == [[b - 128 for b in row] for row in bits]
    decoded = [np.frombuffer(base64.b64decode(s), dtype="<f4") for s in got["base64"]]
    np.testing.assert_array_equal(np.stack(decoded), floats)


def test_v2_embed_defaults_to_float_and_dedupes_types() -> None:
    fake = runtime()
    assert list(v2_embed(fake, texts=["x"])["embeddings"]) == ["float"]
    twice = v2_embed(fake, texts=["x"], embedding_types=["int8", "float", "int8"])
    assert list(twice["embeddings"]) == ["int8", "float"]


@pytest.mark.parametrize(
    ("input_type", "prefix"),
    [
        ("search_query", "query: "),
        ("search_document", "passage: "),
        ("classification", "query: "),  # the model's default prompt
        ("clustering", "query: "),
        (None, "query: "),
    ],
)
def test_v2_input_type_picks_the_prompt(input_type: str | None, prefix: str) -> None:
    fake = runtime(prompts=True)
    fields = {} if input_type is None else {"input_type": input_type}
    body = v2_embed(fake, texts=["a b"], **fields)
    np.testing.assert_allclose(
        body["embeddings"]["float"][0], fake.expected_vector("a b", prefix=prefix), rtol=1e-5
    )


def test_v2_inputs_with_text_content_and_output_dimension() -> None:
    fake = runtime()
    inputs = [{"content": [{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}]}]
    body = v2_embed(fake, inputs=inputs, output_dimension=4, embedding_types=["float", "ubinary"])
    want = fake.expected_vector("a b c", normalize=False)[:4]
    got = np.asarray(body["embeddings"]["float"][0])
    np.testing.assert_allclose(got, want / np.linalg.norm(want), rtol=1e-5)
    assert body["texts"] == ["a b\nc"]
    assert len(body["embeddings"]["ubinary"][0]) == 1  # 4 dimensions, padded to a byte


def test_v2_truncate_end_start_and_none() -> None:
    fake = runtime()
    end = v2_embed(fake, texts=[LONG])["embeddings"]["float"][0]  # Cohere's default: END
    np.testing.assert_allclose(end, fake.expected_vector(LONG), rtol=1e-5)
    start = v2_embed(fake, texts=[LONG], truncate="START")["embeddings"]["float"][0]
    kept = fake.vector_of_ids(fake._cut(fake.word_ids(LONG), "left"))
    np.testing.assert_allclose(start, kept / np.linalg.norm(kept), rtol=1e-5)
    refused = run(
        fake, job("none", ApiShape.COHERE_EMBED_V2, {"texts": [LONG], "truncate": "NONE"})
    )
    assert "over this model's limit of 16" in error_of(refused["none"], LimitExceeded)


@pytest.mark.parametrize(
    ("payload", "hint"),
    [
        ({"texts": ["a"], "images": ["data:image/png;base64,AA=="]}, "'images' are not served"),
        ({"texts": ["a"], "inputs": [{"content": [{"type": "text", "text": "b"}]}]}, "exactly"),
        ({}, "exactly one of 'texts' or 'inputs'"),
        ({"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "image"),
        ({"inputs": [{"content": []}]}, "inputs[0] has no content"),
        ({"texts": []}, "'texts' must not be empty"),
        ({"texts": ["a"], "embedding_types": []}, "name at least one"),
        ({"texts": ["a"], "embedding_types": ["int4"]}, "embedding_types"),
        ({"texts": ["a"], "input_type": "image"}, "the fleet embeds text"),
        ({"texts": ["a"], "input_type": "search"}, "'search_query'"),
        ({"texts": ["a"], "truncate": "MIDDLE"}, "truncate"),
        ({"texts": ["a"], "max_tokens": 8}, "'max_tokens' is 8, below this model's window of 16"),
        ({"texts": ["a"], "max_tokens": 0}, "'max_tokens' must be a positive integer"),
    ],
)
def test_v2_embed_bad_bodies(payload: dict[str, object], hint: str) -> None:
    outcome = run(runtime(), job("bad", ApiShape.COHERE_EMBED_V2, payload))["bad"]
    assert hint in error_of(outcome)


def test_v2_embed_max_tokens_at_or_over_the_window_is_kept() -> None:
    body = v2_embed(runtime(), texts=["a"], max_tokens=16)
    assert len(body["embeddings"]["float"]) == 1


def test_v2_rerank_cross_encoder_top_n_and_long_documents() -> None:
    fake = runtime(cross=True)
    docs = ["paris is the capital", "bread", LONG, "cheese and wine"]
    payload = {"model": "model", "query": "capital", "documents": docs, "top_n": 3}
    body = body_of(run(fake, job("rr", ApiShape.COHERE_RERANK_V2, payload))["rr"])
    assert set(body) == {"id", "results", "meta"}
    assert body["id"] == "rr"
    assert body["meta"]["api_version"] == {"version": "2"}
    want = [sigmoid(float(fake.expected_vector(f"capital {d}", normalize=False)[0])) for d in docs]
    top = sorted(range(len(docs)), key=lambda i: -want[i])[:3]
    assert [r["index"] for r in body["results"]] == top  # the long one is cut, not refused
    for r in body["results"]:
        assert set(r) == {"index", "relevance_score"}
        assert r["relevance_score"] == pytest.approx(want[r["index"]], rel=1e-5)


def test_v2_rerank_bad_bodies() -> None:
    fake = runtime(cross=True)
    cases = {
        "cap": ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 4}, "below this model"),
        "top": ({"query": "q", "documents": ["a"], "top_n": 0}, "'top_n' must be a positive"),
        "none": ({"query": "q", "documents": []}, "'documents' must not be empty"),
        "obj": ({"query": "q", "documents": [{"text": "a"}]}, "documents"),
    }
    outcomes = run(fake, *(job(k, ApiShape.COHERE_RERANK_V2, p) for k, (p, _) in cases.items()))
    for key, (_, hint) in cases.items():
        assert hint in error_of(outcomes[key]), key


def test_similarity_is_the_cosine_to_the_source() -> None:
    fake = runtime(prompts=True)
    source, others = "a fox", ["a quick fox", "tax law", "fox"]
    payload: dict[str, object] = {"inputs": {"source_sentence": source, "sentences": others}}
    named = {**payload, "parameters": {"prompt_name": "passage"}}
    outcomes = run(
        fake,
        job("sim", ApiShape.TEI_SIMILARITY, payload),
        job("root", ApiShape.TEI_ROOT, payload),
        job("named", ApiShape.TEI_SIMILARITY, named),
    )
    for key, prefix in [("sim", "query: "), ("root", "query: "), ("named", "passage: ")]:
        src = fake.expected_vector(source, prefix=prefix)
        want = [float(fake.expected_vector(t, prefix=prefix) @ src) for t in others]
        assert body_of(outcomes[key]) == pytest.approx(want, rel=1e-5, abs=1e-6), key


def test_root_still_embeds_tei_bodies() -> None:
    fake = runtime()
    outcomes = run(
        fake,
        job("list", ApiShape.TEI_ROOT, {"inputs": ["a b", "c"]}),
        job("one", ApiShape.TEI_ROOT, {"inputs": "a b", "normalize": False}),
    )
    np.testing.assert_allclose(
        body_of(outcomes["list"]),
        [fake.expected_vector("a b"), fake.expected_vector("c")],
        rtol=1e-5,
    )
    np.testing.assert_allclose(
        body_of(outcomes["one"]), [fake.expected_vector("a b", normalize=False)], rtol=1e-5
    )


def test_similarity_bad_bodies() -> None:
    fake = runtime()
    outcomes = run(
        fake,
        job(
            "empty", ApiShape.TEI_SIMILARITY, {"inputs": {"source_sentence": "a", "sentences": []}}
        ),
        job("flat", ApiShape.TEI_SIMILARITY, {"inputs": ["a", "b"]}),
        job("root", ApiShape.TEI_ROOT, {"inputs": {"source_sentence": "a"}}),
    )
    assert "'sentences' must not be empty" in error_of(outcomes["empty"])
    assert "invalid request body" in error_of(outcomes["flat"])
    assert "invalid request body" in error_of(outcomes["root"])


@pytest.mark.parametrize("ids", [[[101, 2023], [101, 7]], [101, 2023, 102]])
def test_openai_token_ids_say_what_to_set(ids: object) -> None:
    outcome = run(runtime(), job("ids", ApiShape.OPENAI_EMBEDDINGS, {"input": ids}))["ids"]
    message = error_of(outcome)
    assert "token ids" in message
    assert "OpenAIEmbeddings(..., check_embedding_ctx_length=False)" in message


def test_openai_other_bad_inputs_keep_the_ordinary_message() -> None:
    outcome = run(runtime(), job("mixed", ApiShape.OPENAI_EMBEDDINGS, {"input": [1, "a"]}))
    message = error_of(outcome["mixed"])
    assert message.startswith("invalid request body") and "token ids" not in message
