"""run_batch: one formed batch through decode, one forward and encode, called directly."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from embedder.batching import BatchLimits
from embedder.codecs import RequestLimits
from embedder.errors import InvalidRequest, LimitExceeded
from embedder.execute import LoadedModel, run_batch
from embedder.jobs import ApiShape, EmbedJob, JobResult
from embedder.workqueue import Outcome
from tests.fakes import FakeRuntime, fake_fleet

NOW = 1_000.0
LIMITS = BatchLimits(max_tokens=512, max_requests=16, max_wait_s=0.0)


def runtime(*, cross: bool = False) -> FakeRuntime:
    return FakeRuntime(fake_fleet("model", max_tokens=16).models["model"], cross=cross)


def job(id: str, shape: ApiShape, payload: dict[str, object], waited_s: float = 0.5) -> EmbedJob:
    return EmbedJob(
        id=id,
        model="model",
        shape=shape,
        body=json.dumps(payload).encode(),
        est_tokens=10,
        deadline=NOW + 30,
        enqueued_at=NOW - waited_s,
    )


def run(fake: FakeRuntime, *jobs: EmbedJob) -> dict[str, Outcome]:
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
