"""Embedding: texts in, vectors out, on the pipelined encoder worker.

``spec`` is the fleet entry and profile (shared with rerank models); ``codecs``,
``bodies``, ``similarity``, ``cohere_v2``, ``quantize`` and ``shapes`` decode the request
bodies of every API dialect and encode their answers (the gateway reads none of them
but ``codecs.RequestLimits``); ``runtimes`` is the runtime registry (torch, ONNX
Runtime, OpenVINO, emulated); ``batching`` and ``adaptive`` form batches (pure);
``execute``, ``pipeline`` and ``worker`` run them; ``engine`` is what the host starts.
"""

from __future__ import annotations

from typing import Any

from embedder.core.fleet import DeviceKind, ModelSpec, entry_as
from embedder.core.jobs import ApiShape
from embedder.tasks.embed import bodies
from embedder.tasks.embed.spec import ENGINE, EmbedSpec, EncoderSpec
from embedder.tasks.kind import Engine, EngineContext, Loader, TaskKind
from embedder.tuned import ProfileChoice


def load(spec: ModelSpec, device: DeviceKind, threads: int) -> Any:
    from embedder.tasks.embed.runtimes import load_runtime  # torch: only where one loads

    return load_runtime(entry_as(spec, EncoderSpec), device, threads)


def quick_tune(
    spec: ModelSpec, device: DeviceKind, loader: Loader, threads: int, fingerprint: str
) -> ProfileChoice:
    from embedder.tuning.quick import quick_choice

    return quick_choice(entry_as(spec, EncoderSpec), device, loader, threads, fingerprint)


def warm_up(runtime: Any) -> None:
    from embedder.tasks.embed.engine import warm_up as run_once

    run_once(runtime)


def prepare() -> None:
    import sentence_transformers  # noqa: F401  # the torch runtime's loader, torch with it

    from embedder.tasks.embed import runtimes  # noqa: F401


def make_engine(context: EngineContext) -> Engine:
    from embedder.tasks.embed.engine import EncoderEngine

    return EncoderEngine(context)


KIND = TaskKind(
    name="embed",
    spec=EmbedSpec,
    routes={
        # TEI answers at its root; huggingface_hub posts feature_extraction and
        # sentence_similarity there
        "/": ApiShape.TEI_ROOT,
        "/v1/embeddings": ApiShape.OPENAI_EMBEDDINGS,
        "/embed": ApiShape.TEI_EMBED,
        "/similarity": ApiShape.TEI_SIMILARITY,
        "/v2/embed": ApiShape.COHERE_EMBED_V2,
    },
    bodies=bodies.BODIES,
    load=load,
    engine=ENGINE,
    make_engine=make_engine,
    quick_tune=quick_tune,
    warm_up=warm_up,
    prepare=prepare,
)
