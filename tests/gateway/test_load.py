"""Many requests at once: each gets exactly its own answer; overload turns into fast 429s;
a failing batch fails only its own requests; a client that leaves costs no compute."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest

from flotilla.settings import Settings
from tests.fakes import FAIL_MARKER
from tests.gateway import expected
from tests.gateway.conftest import FAKE_MAX_TOKENS, Loader, Stack, StackFactory

EMBEDDERS = ("alpha", "beta", "gamma")


@dataclass(frozen=True)
class Call:
    """One request and the check of its response against its own inputs."""

    path: str
    body: dict[str, Any]
    check: Callable[[Stack, httpx.Response], None]


def _words(rng: random.Random, n: int, tag: str) -> str:
    # The tag makes each request's texts its own, so a mixed-up reply cannot pass.
    return " ".join([tag, *(f"w{rng.randrange(10_000)}" for _ in range(n - 1))])


def _texts(rng: random.Random, tag: str, *, allow_over: bool) -> list[str]:
    count = rng.choice([1, 1, 2, 3, 5, 8, 13, 21, 30])
    texts = []
    for j in range(count):
        kind = rng.random()
        if kind < 0.5:
            n = rng.randint(1, 6)  # short
        elif kind < 0.9 or not allow_over:
            n = rng.randint(20, FAKE_MAX_TOKENS - 2)  # long, within the limit
        else:
            n = rng.randint(FAKE_MAX_TOKENS, 3 * FAKE_MAX_TOKENS)  # over: truncated
        texts.append(_words(rng, n, f"{tag}-{j}"))
    return texts


def make_call(rng: random.Random, i: int) -> Call:
    tag = f"req{i}"
    route = rng.choice(["openai", "openai", "tei", "tei", "cohere", "rerank"])
    model = rng.choice(EMBEDDERS)

    if route == "openai":
        texts = _texts(rng, tag, allow_over=False)
        encoding = rng.choice(["float", "base64"])

        def check_openai(s: Stack, r: httpx.Response) -> None:
            assert r.json()["model"] == model
            want = expected.embeddings(s.runtime(model), texts)
            np.testing.assert_allclose(expected.openai_vectors(r.json()), want, atol=1e-6)

        body = {"model": model, "input": texts, "encoding_format": encoding}
        return Call("/v1/embeddings", body, check_openai)

    if route == "tei":
        texts = _texts(rng, tag, allow_over=True)
        normalize = rng.random() < 0.7

        def check_tei(s: Stack, r: httpx.Response) -> None:
            assert r.headers["x-model"] == model
            want = expected.embeddings(s.runtime(model), texts, normalize=normalize)
            np.testing.assert_allclose(np.asarray(r.json()), want, rtol=1e-5, atol=1e-6)

        body = {"model": model, "inputs": texts, "normalize": normalize, "truncate": True}
        return Call("/embed", body, check_tei)

    query = _words(rng, rng.randint(1, 5), f"{tag}-q")
    docs = [_words(rng, rng.randint(1, 20), f"{tag}-{j}") for j in range(rng.randint(1, 30))]
    if route == "cohere":  # a bi-encoder, scoring by cosine

        def check_cohere(s: Stack, r: httpx.Response) -> None:
            runtime = s.runtime(model)
            got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
            want = {j: expected.cosine_score(runtime, query, d) for j, d in enumerate(docs)}
            assert sorted(got) == sorted(want)
            for j, score in got.items():
                assert score == pytest.approx(want[j], rel=1e-5, abs=1e-6)

        return Call("/v1/rerank", {"model": model, "query": query, "documents": docs}, check_cohere)

    def check_rerank(s: Stack, r: httpx.Response) -> None:  # the cross-encoder
        runtime = s.runtime("judge")
        got = {x["index"]: x["score"] for x in r.json()}
        want = {j: expected.cross_score(runtime, query, d) for j, d in enumerate(docs)}
        assert sorted(got) == sorted(want)
        for j, score in got.items():
            assert score == pytest.approx(want[j], rel=1e-5)

    return Call("/rerank", {"query": query, "texts": docs}, check_rerank)


async def test_200_concurrent_mixed_requests_each_get_their_own_answer(
    make_stack: StackFactory,
) -> None:
    rng = random.Random(20240611)
    calls = [make_call(rng, i) for i in range(200)]
    assert {c.path for c in calls} == {"/v1/embeddings", "/embed", "/v1/rerank", "/rerank"}
    async with make_stack(Settings(max_inflight_tokens=10_000_000)) as s:
        responses = await asyncio.wait_for(
            asyncio.gather(*(s.client.post(c.path, json=c.body) for c in calls)), 30
        )
        for call, response in zip(calls, responses, strict=True):
            assert response.status_code == 200, (call.path, response.text)
            call.check(s, response)
        # The worker batched: fewer forward passes than requests.
        passes = sum(len(s.runtime(m).forward_calls) for m in (*EMBEDDERS, "judge"))
        assert passes < len(calls)


async def test_overload_gives_fast_429s_never_a_hang(make_stack: StackFactory) -> None:
    # Each request is ~15 estimated tokens; 60 fit in flight, so most of a burst of 40
    # is refused at once while the slow model works through the rest.
    settings = Settings(max_inflight_tokens=60)
    async with make_stack(settings, loader=Loader(seconds_per_token=0.01)) as s:
        texts = [f"burst request number {i}" for i in range(40)]
        responses = await asyncio.wait_for(
            asyncio.gather(
                *(
                    s.client.post("/v1/embeddings", json={"model": "alpha", "input": t})
                    for t in texts
                )
            ),
            10,
        )
        statuses = [r.status_code for r in responses]
        assert set(statuses) == {200, 429}, statuses
        assert statuses.count(200) >= 3
        assert statuses.count(429) >= 20
        runtime = s.runtime("alpha")
        for text, response in zip(texts, responses, strict=True):
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
                error = response.json()["error"]
                assert error["type"] == "overloaded"
                assert "Retry-After" in error["message"]
            else:
                np.testing.assert_allclose(
                    expected.openai_vectors(response.json())[0],
                    expected.embedding(runtime, text),
                    atol=1e-6,
                )
        # The budget was released: a retry is admitted.
        retry = await s.client.post("/v1/embeddings", json={"model": "alpha", "input": "again"})
        assert retry.status_code == 200
        assert s.app.state.gateway.admission.inflight["alpha"] == 0


async def test_request_larger_than_the_whole_budget_is_413(make_stack: StackFactory) -> None:
    async with make_stack(Settings(max_inflight_tokens=60)) as s:
        response = await s.client.post(
            "/v1/embeddings", json={"model": "alpha", "input": ["x" * 400]}
        )
        assert response.status_code == 413
        assert "--max-inflight-tokens" in response.json()["error"]["message"]


async def test_a_failing_batch_fails_its_requests_and_the_next_succeed(
    make_stack: StackFactory,
) -> None:
    async with make_stack() as s:
        poisoned = await s.client.post(
            "/v1/embeddings", json={"model": "beta", "input": ["fine", f"a {FAIL_MARKER} b"]}
        )
        assert poisoned.status_code == 500
        error = poisoned.json()["error"]
        assert error["type"] == "inference_failed"
        assert "'beta'" in error["message"]

        tei = await s.client.post("/embed", json={"model": "beta", "inputs": FAIL_MARKER})
        assert tei.status_code == 500
        assert tei.json()["error_type"] == "inference_failed"

        # Sent together, the poison and its batchmates all get an answer: their own vectors,
        # or the batch's error; nobody hangs.
        clean = [f"clean text {i}" for i in range(6)]
        together = await asyncio.wait_for(
            asyncio.gather(
                s.client.post("/v1/embeddings", json={"model": "beta", "input": FAIL_MARKER}),
                *(
                    s.client.post("/v1/embeddings", json={"model": "beta", "input": t})
                    for t in clean
                ),
            ),
            10,
        )
        assert together[0].status_code == 500
        runtime = s.runtime("beta")
        for text, response in zip(clean, together[1:], strict=True):
            if response.status_code == 500:
                assert response.json()["error"]["type"] == "inference_failed"
            else:
                assert response.status_code == 200
                np.testing.assert_allclose(
                    expected.openai_vectors(response.json())[0],
                    expected.embedding(runtime, text),
                    atol=1e-6,
                )

        after = await asyncio.wait_for(
            asyncio.gather(
                *(
                    s.client.post("/v1/embeddings", json={"model": "beta", "input": t})
                    for t in clean
                )
            ),
            10,
        )
        assert [r.status_code for r in after] == [200] * len(clean)
        assert (w := s.host.engines["encoder"].worker) is not None and all(
            not t.done() for t in w._tasks
        )


async def _hold_the_worker(s: Stack) -> asyncio.Task[httpx.Response]:
    """Start a one-input request and wait until its forward pass is parked on the gate."""
    blocker = asyncio.create_task(
        s.client.post("/v1/embeddings", json={"model": "alpha", "input": "blocker"})
    )
    runtime = s.runtime("alpha")
    await asyncio.wait_for(asyncio.to_thread(runtime.entered.wait, 5), 6)
    assert runtime.forward_calls == []  # counted once the gate opens
    return blocker


async def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    step = 0.005
    for _ in range(int(timeout_s / step)):
        if predicate():
            return
        await asyncio.sleep(step)
    raise AssertionError(f"not reached within {timeout_s} s")


async def _finish(s: Stack, gate: threading.Event, blocker: Awaitable[httpx.Response]) -> None:
    gate.set()
    assert (await asyncio.wait_for(blocker, 5)).status_code == 200
    # A later request flushes the pipeline: anything still queued would have run by its end.
    after = await s.client.post("/v1/embeddings", json={"model": "alpha", "input": ["x", "y"]})
    assert after.status_code == 200


async def test_cancelled_request_withdraws_its_job(make_stack: StackFactory) -> None:
    gate = threading.Event()
    async with make_stack(loader=Loader(forward_gate=gate)) as s:
        blocker = await _hold_the_worker(s)
        texts = ["one", "two", "three", "four", "five"]
        waiting = asyncio.create_task(
            s.client.post("/v1/embeddings", json={"model": "alpha", "input": texts})
        )
        await _until(lambda: len(s.queue.jobs) == 2)
        job, future = s.queue.jobs[1]
        await asyncio.sleep(0.02)  # let the worker pull it and form its batch
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert future.cancelled()
        assert s.queue.cancelled([job.id]) == {job.id}

        await _finish(s, gate, blocker)
        assert 5 not in s.runtime("alpha").forward_calls  # the worker never ran it
        assert s.runtime("alpha").forward_calls == [1, 2]
        assert s.app.state.gateway.admission.inflight["alpha"] == 0


async def test_client_disconnect_withdraws_its_job(make_stack: StackFactory) -> None:
    gate = threading.Event()
    async with make_stack(loader=Loader(forward_gate=gate)) as s:
        blocker = await _hold_the_worker(s)
        body = json.dumps({"model": "alpha", "input": ["one", "two", "three"]}).encode()
        gone = asyncio.Event()
        received: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if not received:
                received.append({"type": "http.request"})
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()  # the connection drops while the request waits for its batch
            return {"type": "http.disconnect"}

        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/embeddings",
            "raw_path": b"/v1/embeddings",
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"host", b"flotilla.test"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
            "client": ("127.0.0.1", 5000),
            "server": ("flotilla.test", 80),
        }
        call = asyncio.create_task(s.app(scope, receive, send))
        await _until(lambda: len(s.queue.jobs) == 2)
        job, future = s.queue.jobs[1]
        await asyncio.sleep(0.02)  # let the worker pull it and form its batch
        gone.set()
        await asyncio.wait_for(call, 5)
        assert sent[0]["type"] == "http.response.start"
        assert sent[0]["status"] == 499
        assert future.cancelled()
        assert s.queue.cancelled([job.id]) == {job.id}

        await _finish(s, gate, blocker)
        assert s.runtime("alpha").forward_calls == [1, 2]  # the 3-input job never ran
