"""run_batch: one formed batch through decode, one forward and encode, called directly."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from embedder.tasks.embed.batching import BatchLimits
from embedder.tasks.embed.codecs import RequestLimits
from embedder.core.errors import InvalidRequest, LimitExceeded
from embedder.tasks.embed.execute import LoadedModel, run_batch
from embedder.core.jobs import ApiShape, Job, JobResult
from embedder.queue import Outcome
from tests.fakes import E5_PROMPTS, FakeRuntime, fake_fleet

NOW = 1_000.0
LIMITS = BatchLimits(max_tokens=512, max_requests=16, max_wait_s=0.0)


def runtime(*, cross: bool = False, prompts: bool = False) -> FakeRuntime:
    fields = E5_PROMPTS if prompts else {}
    return FakeRuntime(fake_fleet("model", max_tokens=16, **fields).models["model"], cross=cross)


def job(id: str, shape: ApiShape, payload: dict[str, object], waited_s: float = 0.5) -> Job:
    return Job(
        id=id,
        model="model",
        shape=shape,
        body=json.dumps(payload).encode(),
        est_tokens=10,
        deadline=NOW + 30,
        enqueued_at=NOW - waited_s,
    )


def run(fake: FakeRuntime, *jobs: Job) -> dict[str, Outcome]:
    report = run_batch(jobs, LoadedModel(fake.spec, fake, LIMITS), RequestLimits(), NOW)
    assert sorted(j.id for j, _ in report.outcomes) == sorted(j.id for j in jobs)
    return {j.id: outcome for j, outcome in report.outcomes}


def body_of(outcome: Outcome) -> Any:
    assert isinstance(outcome, JobResult), outcome
    return json.loads(outcome.body)


def sigmoid(x: float) -> float:
    return float(1.0 / (1.0 + np.exp(-x)))


def test_timings_and_tokens_of_a_batch() -> None:
    fake = runtime()
    jobs = [job(f"j{i}", ApiShape.TEI_EMBED, {"inputs": ["a b", "c"]}) for i in range(3)]
    report = run_batch(jobs, LoadedModel(fake.spec, fake, LIMITS), RequestLimits(), NOW)
    assert fake.forward_calls == [6]  # three jobs, two inputs each, one forward
    assert report.tokens == 3 * (4 + 3)
    for _, outcome in report.outcomes:
        assert isinstance(outcome, JobResult)
        assert outcome.prompt_tokens == 7
        assert outcome.timings.queue_s == pytest.approx(0.5)
        assert outcome.timings.inference_s == report.inference_s


def test_a_batch_of_only_bad_jobs_runs_no_forward() -> None:
    fake = runtime()
    report = run_batch(
        [job("bad", ApiShape.TEI_EMBED, {"inputs": []})],
        LoadedModel(fake.spec, fake, LIMITS),
        RequestLimits(),
        NOW,
    )
    assert fake.forward_calls == []
    assert report.tokens == 0
    assert isinstance(report.outcomes[0][1], InvalidRequest)


def test_dimensions_over_the_model_fail_that_job_alone() -> None:
    fake = runtime()
    outcomes = run(
        fake,
        job("too-wide", ApiShape.OPENAI_EMBEDDINGS, {"input": "a", "dimensions": 9}),
        job("narrow", ApiShape.OPENAI_EMBEDDINGS, {"input": "a", "dimensions": 3}),
    )
    assert isinstance(outcomes["too-wide"], InvalidRequest)
    assert "this model has 8" in outcomes["too-wide"].message
    vector = np.asarray(body_of(outcomes["narrow"])["data"][0]["embedding"])
    full = fake.expected_vector("a", normalize=False)[:3]
    np.testing.assert_allclose(vector, full / np.linalg.norm(full), atol=1e-6)


def test_cross_encoder_rerank_sorts_by_sigmoid_score() -> None:
    fake = runtime(cross=True)
    docs = ["alpha beta", "gamma", "delta epsilon zeta"]
    outcomes = run(
        fake,
        job("probs", ApiShape.TEI_RERANK, {"query": "q", "texts": docs, "return_text": True}),
        job("raw", ApiShape.TEI_RERANK, {"query": "q", "texts": docs, "raw_scores": True}),
    )
    raw = [float(fake.expected_vector(f"q {d}", normalize=False)[0]) for d in docs]
    order = sorted(range(3), key=lambda i: -raw[i])
    probs = body_of(outcomes["probs"])
    assert [r["index"] for r in probs] == order
    assert [r["score"] for r in probs] == pytest.approx([sigmoid(raw[i]) for i in order])
    assert [r["text"] for r in probs] == [docs[i] for i in order]
    assert [r["score"] for r in body_of(outcomes["raw"])] == pytest.approx(
        [raw[i] for i in order], rel=1e-5
    )


def test_bi_encoder_rerank_scores_by_cosine_to_the_query() -> None:
    fake = runtime()
    docs = ["one", "two words", "three more words"]
    payload = {"query": "the query", "documents": docs, "top_n": 2, "return_documents": True}
    out = body_of(run(fake, job("co", ApiShape.COHERE_RERANK, payload))["co"])
    query = fake.expected_vector("the query")
    cosines = [float(fake.expected_vector(d) @ query) for d in docs]
    order = sorted(range(3), key=lambda i: -cosines[i])[:2]
    assert out["id"] == "co"
    assert [r["index"] for r in out["results"]] == order
    assert [r["relevance_score"] for r in out["results"]] == pytest.approx(
        [cosines[i] for i in order], abs=1e-5
    )
    assert [r["document"]["text"] for r in out["results"]] == [docs[i] for i in order]


def test_an_over_long_rerank_document_is_a_limit_error_unless_truncated() -> None:
    fake = runtime(cross=True)
    long_doc = " ".join(["word"] * 30)
    texts = ["short", long_doc]
    outcomes = run(
        fake,
        job("strict", ApiShape.TEI_RERANK, {"query": "q", "texts": texts}),
        job("cut", ApiShape.TEI_RERANK, {"query": "q", "texts": texts, "truncate": True}),
    )
    strict = outcomes["strict"]
    assert isinstance(strict, LimitExceeded)
    assert "document 1 has 33 tokens" in strict.message
    assert "limit of 16" in strict.message
    assert len(body_of(outcomes["cut"])) == 2


# -- prompts ----------------------------------------------------------------------------


def embedding(outcome: Outcome) -> Any:
    body = body_of(outcome)
    return np.asarray(body["data"][0]["embedding"] if "data" in body else body[0])


@pytest.mark.parametrize(
    ("shape", "payload", "prefix"),
    [
        (ApiShape.OPENAI_EMBEDDINGS, {"input": "a b"}, "query: "),  # the default prompt
        (ApiShape.OPENAI_EMBEDDINGS, {"input": "a b", "input_type": "query"}, "query: "),
        (ApiShape.OPENAI_EMBEDDINGS, {"input": "a b", "input_type": "document"}, "passage: "),
        (ApiShape.OPENAI_EMBEDDINGS, {"input": "a b", "input_type": "passage"}, "passage: "),
        (ApiShape.TEI_EMBED, {"inputs": "a b", "prompt_name": "passage"}, "passage: "),
        (ApiShape.TEI_EMBED, {"inputs": "a b", "prompt_name": "query"}, "query: "),
        (ApiShape.TEI_EMBED, {"inputs": "a b"}, "query: "),
    ],
)
def test_the_chosen_prompt_comes_before_each_input(
    shape: ApiShape, payload: dict[str, object], prefix: str
) -> None:
    fake = runtime(prompts=True)
    outcome = run(fake, job("j", shape, payload))["j"]
    np.testing.assert_allclose(
        embedding(outcome), fake.expected_vector("a b", prefix=prefix), atol=1e-6
    )


def test_a_model_without_prompts_ignores_input_type() -> None:
    fake = runtime()
    outcome = run(fake, job("j", ApiShape.OPENAI_EMBEDDINGS, {"input": "a", "input_type": "query"}))
    np.testing.assert_allclose(embedding(outcome["j"]), fake.expected_vector("a"), atol=1e-6)


def test_an_unknown_prompt_name_fails_that_job_alone_with_422() -> None:
    fake = runtime(prompts=True)
    outcomes = run(
        fake,
        job("bad", ApiShape.TEI_EMBED, {"inputs": "a", "prompt_name": "search"}),
        job("good", ApiShape.TEI_EMBED, {"inputs": "a", "prompt_name": "passage"}),
    )
    bad = outcomes["bad"]
    assert isinstance(bad, InvalidRequest) and bad.http_status == 422
    assert "its prompts: 'passage', 'query'" in bad.message
    assert isinstance(outcomes["good"], JobResult)
    plain = run(runtime(), job("p", ApiShape.TEI_EMBED, {"inputs": "a", "prompt_name": "query"}))
    assert isinstance(plain["p"], InvalidRequest)
    assert "defines no prompts" in plain["p"].message


def test_the_prompts_tokens_count_towards_the_limit() -> None:
    text = " ".join(["w"] * 14)  # 16 tokens with [CLS] and [SEP]: the limit exactly
    fits = run(runtime(), job("plain", ApiShape.TEI_EMBED, {"inputs": text}))["plain"]
    assert isinstance(fits, JobResult) and fits.prompt_tokens == 16
    over = run(runtime(prompts=True), job("e5", ApiShape.TEI_EMBED, {"inputs": text}))["e5"]
    assert isinstance(over, LimitExceeded)
    assert "input 0 has 17 tokens" in over.message  # "query:" is one more word here


def test_truncating_on_the_left_keeps_the_prompt() -> None:
    fake = runtime(prompts=True)
    words = [f"w{i}" for i in range(30)]
    payload = {
        "inputs": " ".join(words),
        "truncate": True,
        "truncation_direction": "left",
        "prompt_name": "passage",
    }
    outcome = run(fake, job("j", ApiShape.TEI_EMBED, payload))["j"]
    assert isinstance(outcome, JobResult) and outcome.prompt_tokens == 16
    kept = fake.word_ids("passage: " + " ".join(words[-13:]))  # prompt + last 13 words
    want = fake.vector_of_ids(kept)
    np.testing.assert_allclose(embedding(outcome), want / np.linalg.norm(want), atol=1e-6)


def test_a_bi_encoder_rerank_embeds_the_query_and_documents_with_their_prompts() -> None:
    fake = runtime(prompts=True)
    docs = ["one", "two words", "three more words"]
    out = body_of(run(fake, job("r", ApiShape.TEI_RERANK, {"query": "q", "texts": docs}))["r"])
    query = fake.expected_vector("q", prefix="query: ")
    cosines = {
        i: float(fake.expected_vector(d, prefix="passage: ") @ query) for i, d in enumerate(docs)
    }
    assert {r["index"]: r["score"] for r in out} == pytest.approx(cosines, abs=1e-5)
