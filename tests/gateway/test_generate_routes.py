"""The generation routes on the gateway alone (no worker, no torch): what a job is sized
at, admission's 429 with Retry-After counting prompt plus max_tokens, and the errors the
gateway answers before anything is queued."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from embedder.core.jobs import ModelState
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.fleet import parse_fleet
from gateway.app import create_app
from gateway.config import GatewayConfig, GatewayLimits

FLEET = parse_fleet(
    {
        "models": {
            "llm": {"source": {"path": "/nowhere"}, "task": "generate", "max_tokens": 1000,
                    "max_new_tokens": 50},
            "emb": {"source": {"path": "/nowhere"}},
        }
    }
)  # fmt: skip
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hello there"}]


class Ready:
    def state(self, model: str) -> ModelState:
        return "ready"

    def describe(self, model: str) -> dict[str, object]:
        return {}


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, InProcessQueue]]:
    limits = GatewayLimits(max_body_bytes=100_000, request_timeout_s=5, max_inflight_tokens=400)
    config = GatewayConfig(
        version="test", bytes_per_token=4, max_documents_per_request=512, limits=limits
    )
    queue = InProcessQueue()
    app = create_app(config, FLEET, queue, Ready())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c, queue


async def test_a_job_is_sized_by_prompt_plus_max_tokens(
    client: tuple[httpx.AsyncClient, InProcessQueue],
) -> None:
    http, queue = client
    body = {"model": "llm", "messages": MESSAGES, "max_tokens": 120}
    request = asyncio.create_task(http.post(CHAT, json=body))
    [job] = await queue.pull(["llm"], 10_000, 2)
    prompt_estimate = len(json.dumps(body)) // 4
    assert 120 < job.est_tokens <= 120 + prompt_estimate + 1
    default = asyncio.create_task(http.post("/v1/completions", json={"prompt": "hi"}))
    [second] = await queue.pull(["llm"], 10_000, 2)  # no model named: the fleet's LLM
    assert 50 < second.est_tokens < 70  # the model's max_new_tokens
    request.cancel()
    default.cancel()


async def test_over_the_inflight_budget_is_429_with_retry_after(
    client: tuple[httpx.AsyncClient, InProcessQueue],
) -> None:
    http, queue = client
    held = asyncio.create_task(
        http.post(CHAT, json={"model": "llm", "messages": MESSAGES, "max_tokens": 300})
    )
    await queue.pull(["llm"], 10_000, 2)  # admitted and queued: 300+ tokens in flight
    refused = await http.post(
        CHAT, json={"model": "llm", "messages": MESSAGES, "max_tokens": 90, "stream": True}
    )
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert "tokens in flight" in refused.json()["error"]["message"]
    too_big = await http.post(CHAT, json={"model": "llm", "messages": MESSAGES, "max_tokens": 500})
    assert too_big.status_code == 413
    held.cancel()


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "llm", "messages": MESSAGES, "n": 2}, 422, "n=2 is not supported"),
        ({"model": "llm:lora", "messages": MESSAGES}, 422, "serves no adapters"),
        ({"model": "emb", "messages": MESSAGES}, 400, "cannot generate text"),
        ({"model": "nope", "messages": MESSAGES}, 404, "not in the fleet"),
        ({"model": "llm", "messages": MESSAGES, "max_tokens": 0}, 422, "at least 1"),
    ],
)  # fmt: skip
async def test_refused_before_queueing(
    client: tuple[httpx.AsyncClient, InProcessQueue],
    body: dict[str, object],
    status: int,
    message: str,
) -> None:
    http, queue = client
    answer = await http.post(CHAT, json=body)
    assert answer.status_code == status and message in answer.json()["error"]["message"]
    assert sum(queue.depth().values()) == 0


async def test_embedding_route_refuses_the_llm(
    client: tuple[httpx.AsyncClient, InProcessQueue],
) -> None:
    answer = await client[0].post("/v1/embeddings", json={"model": "llm", "input": "x"})
    assert answer.status_code == 400 and "cannot embed" in answer.json()["error"]["message"]
