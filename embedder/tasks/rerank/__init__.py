"""Rerank: a query and documents in, a relevance score per document out. Rerank models
are encoders loaded as cross-encoders and run on the embedding kind's engine and
runtimes (``embedder.tasks.embed``); an embedding model answers a rerank too, scoring by
the cosine of its vectors."""

from __future__ import annotations

from embedder.core.jobs import ApiShape
from embedder.tasks import embed
from embedder.tasks.kind import TaskKind
from embedder.tasks.rerank import codecs
from embedder.tasks.rerank.spec import RerankSpec

KIND = TaskKind(
    name="rerank",
    spec=RerankSpec,
    routes={
        "/rerank": ApiShape.TEI_RERANK,
        "/v1/rerank": ApiShape.COHERE_RERANK,
        "/v2/rerank": ApiShape.COHERE_RERANK_V2,
    },
    bodies=codecs.BODIES,
    load=embed.load,
    engine=embed.KIND.engine,
    make_engine=embed.make_engine,
    answered_by=("rerank", "embed"),
    quick_tune=embed.quick_tune,
    warm_up=embed.warm_up,
    prepare=embed.prepare,
)
