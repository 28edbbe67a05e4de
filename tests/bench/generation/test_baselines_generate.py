"""The baselines' worker on the suite's tiny GGUF model (tinycoder's untrained
1M-parameter Llama): static batches give each row what it gets alone."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from bench.generation.local import Generator, Pending


def _tiny_gguf() -> Path:
    spec = importlib.util.find_spec("tinycoder")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("tinycoder (the suite's tiny GGUF model) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "models" / "tiny.gguf"


async def _answer(pending: Pending) -> tuple[str, str, int, int]:
    text = ""
    while True:
        kind, *rest = await pending.events.get()
        if kind == "text":
            text += rest[0]
        elif kind == "end":
            return text, rest[0], rest[1], rest[2]
        else:
            raise AssertionError(f"the worker failed: {rest[0]}")


@pytest.mark.slow
async def test_static_batches_equal_one_at_a_time() -> None:
    generator = Generator(_tiny_gguf(), threads=1, batch_wait_ms=2000)
    generator.start()
    loop = asyncio.get_running_loop()
    tokenizer = generator.tokenizer
    texts = ["def add(a, b):", "hello", "import os\nimport sys\n\nclass Config:", "x = 1"]
    limits = [12, 5, 20, 1]
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    try:
        alone = []
        for ids, limit in zip(prompts, limits, strict=True):
            pending = Pending(ids, limit, 1, loop)
            generator.inbox.put(pending)
            alone.append(await asyncio.wait_for(_answer(pending), 60))
        batch = [Pending(ids, limit, 4, loop) for ids, limit in zip(prompts, limits, strict=True)]
        for pending in batch:
            generator.inbox.put(pending)
        together = await asyncio.wait_for(asyncio.gather(*(_answer(p) for p in batch)), 60)
    finally:
        generator.stop()
    assert list(together) == alone
    for (_, reason, prompt_tokens, completion_tokens), ids, limit in zip(
        alone, prompts, limits, strict=True
    ):
        assert prompt_tokens == len(ids)
        assert completion_tokens == limit if reason == "length" else completion_tokens < limit
