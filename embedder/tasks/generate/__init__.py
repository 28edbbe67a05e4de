"""Text generation on the pull substrate: a causal LM served with continuous batching.

``runtime`` loads the model (a GGUF file through transformers, dequantized) and its
tokenizer; ``kv`` keeps the running sequences' KV cache as one left-padded batch that
sequences join and leave between steps; ``sampling`` picks each next token; ``text``
turns tokens into text and applies stop strings; ``requests`` and ``replies`` are the
OpenAI bodies in and out; ``engine`` is the loop that pulls generation jobs against a
KV budget and runs one step at a time (iteration-level scheduling). Only ``requests``
and ``replies`` are free of torch; ``spec`` is the fleet entry and profile.
"""

from __future__ import annotations

from typing import Any

from embedder.core.fleet import DeviceKind, ModelSpec, entry_as
from embedder.core.jobs import ApiShape
from embedder.serving.per_model import ModelLoop, OneLoopPerModel
from embedder.tasks.generate import requests
from embedder.tasks.generate.spec import GenerateSpec
from embedder.tasks.kind import Engine, EngineContext, TaskKind


def load(spec: ModelSpec, device: DeviceKind, threads: int) -> Any:
    from embedder.tasks.generate.runtime import load  # torch: only where a generator loads

    return load(entry_as(spec, GenerateSpec), device, threads)


def make_engine(context: EngineContext) -> Engine:
    from embedder.tasks.generate.engine import GenerationEngine

    def loop(spec: ModelSpec, runtime: Any) -> ModelLoop:
        entry = entry_as(spec, GenerateSpec)
        return GenerationEngine(context.queue, entry, runtime, context.turns)

    return OneLoopPerModel(loop)


KIND = TaskKind(
    name="generate",
    spec=GenerateSpec,
    routes={
        "/v1/chat/completions": ApiShape.OPENAI_CHAT,
        "/v1/completions": ApiShape.OPENAI_COMPLETIONS,
    },
    bodies={
        ApiShape.OPENAI_CHAT: requests.ChatBody,
        ApiShape.OPENAI_COMPLETIONS: requests.CompletionBody,
    },
    load=load,
    engine="generate",
    make_engine=make_engine,
)
