"""Continuous batching against ``model.generate``: 32 concurrent greedy requests of mixed
prompt and output lengths, run through the engine over the in-process queue while
sequences join and leave the running batch (a KV budget smaller than all of them, chunked
prefill), each equal token for token to its prompt generated alone."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest
import torch

from embedder.core.errors import TaskNotSupported
from embedder.tasks.generate.engine import GenerationEngine
from embedder.tasks.generate.runtime import GenerationRuntime
from embedder.core.jobs import ApiShape, Job, JobResult
from embedder.queue.inprocess import InProcessQueue
from embedder.serving.turns import DeviceTurns
from tests.embedder.tasks.generate.conftest import tiny_spec

WORDS = [
    "the",
    "tenant",
    "pays",
    "rent",
    "and",
    "the",
    "landlord",
    "keeps",
    "the",
    "house",
    "warm",
    "in",
    "winter",
]


def completion_job(
    prompt: str, max_tokens: int, runtime: GenerationRuntime, **extra: object
) -> Job:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    est = len(runtime.encode(prompt)) + max_tokens
    return Job.new(
        "tiny-llm", ApiShape.OPENAI_COMPLETIONS, json.dumps({**body, **extra}).encode(),
        now=time.time(), timeout_s=60, bytes_per_token=4, est_tokens=est,
    )  # fmt: skip


def alone(runtime: GenerationRuntime, prompt: str, max_tokens: int) -> list[int]:
    ids = runtime.encode(prompt)
    with torch.inference_mode():
        out = runtime.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_tokens,
            do_sample=False,
        )
    tokens: list[int] = out[0, len(ids) :].tolist()
    return tokens


async def test_32_concurrent_equal_generate_alone(tiny_runtime: GenerationRuntime) -> None:
    rng = random.Random(12)
    cases = [
        (" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))), rng.randint(1, 24))
        for _ in range(32)
    ]
    queue = InProcessQueue()
    # Room for about a third of them at once, prompts prefilled 16 tokens per step.
    spec = tiny_spec(max_batch_tokens=900, max_batch_requests=12, prefill_chunk_tokens=16)
    engine = GenerationEngine(queue, spec, tiny_runtime, DeviceTurns())
    async with engine:
        futures = [await queue.put(completion_job(p, n, tiny_runtime)) for p, n in cases]
        results: list[JobResult] = await asyncio.wait_for(asyncio.gather(*futures), 60)
    for (prompt, n), result in zip(cases, results, strict=True):
        choice = json.loads(result.body)["choices"][0]
        expected = alone(tiny_runtime, prompt, n)
        assert choice["token_ids"] == expected, prompt
        ended = expected[-1] in tiny_runtime.eos_token_ids
        assert choice["finish_reason"] == ("stop" if ended else "length")


async def test_chat_without_a_template_is_refused_alone(tiny_runtime: GenerationRuntime) -> None:
    spec = tiny_spec().model_copy(update={"chat_template": None})
    bare = GenerationRuntime(spec, tiny_runtime.model, tiny_runtime.tokenizer, "float32")
    queue = InProcessQueue()
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    job = Job.new(
        "tiny-llm", ApiShape.OPENAI_CHAT, json.dumps(chat).encode(),
        now=time.time(), timeout_s=60, bytes_per_token=4, est_tokens=10,
    )  # fmt: skip
    async with GenerationEngine(queue, spec, bare, DeviceTurns()):
        refused = await queue.put(job)
        served = await queue.put(completion_job("rent", 3, bare))
        with pytest.raises(TaskNotSupported, match="no chat template"):
            await asyncio.wait_for(refused, 30)
        result = await asyncio.wait_for(served, 30)
    assert json.loads(result.body)["usage"]["completion_tokens"] == 3


async def test_the_engine_lends_the_device_before_each_decoder_block(
    tiny_runtime: GenerationRuntime,
) -> None:
    turns = DeviceTurns()
    calls: list[str] = []
    turns.lend_point = lambda owner, deadline: calls.append(owner)  # type: ignore[method-assign]
    queue = InProcessQueue()
    async with GenerationEngine(queue, tiny_spec(), tiny_runtime, turns):
        await asyncio.wait_for(await queue.put(completion_job("rent", 3, tiny_runtime)), 30)
    blocks = len(tiny_runtime.layers())
    assert blocks >= 2
    assert len(calls) >= 3 * blocks and set(calls) == {"generate:tiny-llm"}  # 3 forwards
    calls.clear()
    with torch.inference_mode():
        tiny_runtime.model(torch.tensor([[1, 2, 3]]))
    assert calls == []  # a stopped engine leaves no hook behind
