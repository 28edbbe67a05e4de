"""``dtype: auto`` keeps bf16 only when it is faster and every probe prompt's greedy
tokens equal fp32's; one differing prompt of several keeps fp32."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from embedder.tasks.generate import runtime
from embedder.tasks.generate.runtime import GenerationRuntime
from tests.embedder.tasks.generate.conftest import tiny_spec


def fake_probe(differ_on: set[int]) -> Any:
    """A probe where bf16 steps twice as fast and its tokens differ on ``differ_on``."""

    def probe(model: Any, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], float]:
        bf16 = next(model.parameters()).dtype == torch.bfloat16
        tokens = [[i] * steps for i in range(len(prompts))]
        if bf16:
            tokens = [[-1] * steps if i in differ_on else t for i, t in enumerate(tokens)]
        return tokens, 0.01 if bf16 else 0.02

    return probe


@pytest.mark.parametrize(("differ_on", "kept"), [(set(), "bfloat16"), ({4}, "float32")])
def test_auto_keeps_bf16_only_when_every_probe_prompt_agrees(
    tiny_runtime: GenerationRuntime,
    monkeypatch: pytest.MonkeyPatch,
    differ_on: set[int],
    kept: str,
) -> None:
    monkeypatch.setattr(runtime, "_greedy_and_time", fake_probe(differ_on))
    model, dtype = runtime._auto_dtype(
        tiny_spec(), tiny_runtime.model, tiny_runtime.tokenizer, "cpu"
    )
    assert dtype == kept
    assert next(model.parameters()).dtype == runtime.DTYPES[kept]
    assert len(runtime._CALIBRATION) > 4  # the prompt that differs is one of several


def test_the_probe_runs_every_prompt_for_its_tokens(tiny_runtime: GenerationRuntime) -> None:
    prompts = [tiny_runtime.encode(t) for t in runtime._CALIBRATION]
    tokens, step_s = runtime._greedy_and_time(tiny_runtime.model, prompts, 8)
    assert [len(t) for t in tokens] == [8] * len(prompts) and step_s > 0
    for prompt, got in zip(prompts[:2], tokens, strict=False):
        with torch.inference_mode():
            alone = tiny_runtime.model.generate(
                torch.tensor([prompt]),
                max_new_tokens=8,
                do_sample=False,
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            )
        assert got == alone[0, len(prompt) :].tolist()
