"""A causal LM and its tokenizer on one device, loaded with transformers.

A GGUF file (``source: {package: ..., file: x.gguf}``) is dequantized at load; a folder
of safetensors loads as it is. ``dtype: auto`` on a CPU times a few decode steps in
fp32 and bf16 and keeps bf16 only where it is at least 10% faster *and* its greedy
tokens on every calibration prompt (32 tokens each) equal fp32's; which wins depends on
the CPU, so it is measured rather than assumed.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from embedder.core.fleet import DeviceKind, ModelSpec
from embedder.tasks.generate.kv import KVBatch, prefill_many

log = logging.getLogger(__name__)

BF16_MIN_GAIN = 1.10
# Greedy text drifts only after a near-tie, so one short probe passed bf16 that changed
# 40-50% of a benchmark's answers: the probe runs several prompts of several kinds, longer.
_CALIBRATION = (
    "The capital of France is Paris. The capital of Germany is",
    "Question: Why do leaves change colour in autumn?\nAnswer:",
    "def fibonacci(n):\n    ",
    "Der Mieter zahlt die Miete, und der Vermieter",
    "Write a short list of three tips for staying healthy:\n1.",
    "Once upon a time, in a small village by the sea,",
)
_CALIBRATION_TOKENS = 32


@dataclass(frozen=True, slots=True)
class GeneratorInfo:
    kind: Literal["generator"]
    device: str
    dtype: str
    max_tokens: int  # the context window: prompt plus generated tokens
    chat_template: bool  # whether chat requests can be rendered


class GenerationRuntime:
    def __init__(self, spec: ModelSpec, model: Any, tokenizer: Any, dtype: str) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template: str | None = spec.chat_template or tokenizer.chat_template
        # GGUF configs may name no end of sequence: the tokenizer's counts too.
        eos = model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(ids)
        model.generation_config.eos_token_id = sorted(ids) or None
        self.info = GeneratorInfo(
            kind="generator",
            device=str(model.device),
            dtype=dtype,
            max_tokens=spec.max_tokens,
            chat_template=self.chat_template is not None,
        )

    def layers(self) -> list[torch.nn.Module]:
        """The decoder's blocks in order: the model's longest list of modules."""
        lists = [list(m) for m in self.model.modules() if isinstance(m, torch.nn.ModuleList)]
        return max(lists, key=len, default=[])

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer(text)["input_ids"]
        return ids

    def render_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The prompt's tokens for chat messages, through the chat template."""
        text = self.tokenizer.apply_chat_template(
            list(messages),
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=True,
        )
        # The template writes the special tokens itself (a BOS among them, if any).
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def decode(self, ids: list[int]) -> str:
        text: str = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text


def _load_model(spec: ModelSpec, dtype: torch.dtype, device: DeviceKind) -> tuple[Any, Any]:
    folder = spec.source.resolve()
    kwargs: dict[str, Any] = {"gguf_file": spec.source.file} if spec.source.file else {}
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    target: Any = "cuda" if device == "cuda" else "cpu"
    return model.to(target).eval(), tokenizer


def _greedy_and_time(
    model: Any, prompts: list[list[int]], steps: int
) -> tuple[list[list[int]], float]:
    """Each prompt's greedy tokens (run as one batch, as serving runs them) and the
    seconds per decode step of that batch."""
    cache, logits = prefill_many(model, prompts)
    out = [[int(t)] for t in torch.argmax(logits, dim=-1)]
    batch = KVBatch()
    batch.join(cache, [len(p) for p in prompts])
    start = time.perf_counter()
    for _ in range(steps - 1):
        picked = torch.argmax(batch.step(model, [row[-1] for row in out]), dim=-1)
        for row, token in zip(out, picked, strict=True):
            row.append(int(token))
    return out, (time.perf_counter() - start) / max(1, steps - 1)


def _auto_dtype(spec: ModelSpec, model: Any, tokenizer: Any, device: DeviceKind) -> tuple[Any, str]:
    if device == "cuda":
        return model.to(torch.bfloat16), "bfloat16"
    prompts = [tokenizer(text)["input_ids"] for text in _CALIBRATION]
    reference, fp32_s = _greedy_and_time(model, prompts, _CALIBRATION_TOKENS)
    bf16 = copy.deepcopy(model).to(torch.bfloat16)  # not a second load of the weights
    tokens, bf16_s = _greedy_and_time(bf16, prompts, _CALIBRATION_TOKENS)
    _, fp32_s2 = _greedy_and_time(model, prompts, 4)  # once more: a busy host slows both alike
    fp32_s = min(fp32_s, fp32_s2)
    gain = fp32_s / bf16_s
    same = sum(t == r for t, r in zip(tokens, reference, strict=True))
    if same == len(prompts) and gain >= BF16_MIN_GAIN:
        log.info("%s: bfloat16 (%.2fx fp32's decode step, same greedy tokens)", spec.name, gain)
        return bf16, "bfloat16"
    why = (
        f"greedy tokens differ on {len(prompts) - same} of {len(prompts)} probe prompts"
        if same < len(prompts)
        else f"only {gain:.2f}x"
    )
    log.info("%s: float32 (bfloat16 %s)", spec.name, why)
    return model, "float32"


DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def load(spec: ModelSpec, device: DeviceKind, threads: int) -> GenerationRuntime:
    if threads:
        torch.set_num_threads(threads)
    asked = spec.profile(device).dtype
    if asked != "auto" and asked not in DTYPES:
        raise ValueError(
            f"model {spec.name!r}: generation runs float32, bfloat16, float16 or auto, "
            f"not {asked!r}"
        )
    model, tokenizer = _load_model(spec, DTYPES.get(asked, torch.float32), device)
    dtype: str = asked
    if asked == "auto":
        model, dtype = _auto_dtype(spec, model, tokenizer, device)
    return GenerationRuntime(spec, model, tokenizer, dtype)
