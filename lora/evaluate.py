"""Retrieval evaluation through flotilla's own pipeline and vector store.

For each model name (a fleet model, or ``base:adapter`` once the workers serve
adapters) the corpus is embedded by the ingest core into a collection of its own
(``<collection>.<model>``), exactly as ``flotilla ingest`` writes documents: jobs on
the work queue, the worker's batches, the store's upserts. Each query is then embedded
through the same queue and searched in that collection. What is measured is therefore
what a deployment would serve, prompts, truncation and store included: the pipeline
puts a model's document prompt before passages and its query prompt before queries
(e5: "passage: ", "query: "); this module never writes a prompt itself.

The BM25 baseline (``lora.bm25``) and the metrics (``lora.metrics``) complete a report
of systems side by side, as a table and as JSON.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from embedder.core.errors import FlotillaError
from ingest.pipeline import IngestCore, RawRecord
from ingest.records import SourceRef
from ingest.store import VectorStore
from lora.metrics import METRICS, Qrels, evaluate, per_query


class EvalError(RuntimeError):
    """A model could not embed the corpus or the queries."""


def collection_for(collection: str, model: str) -> str:
    """Each model gets a collection of its own: vectors of two models never share one."""
    return f"{collection}.{re.sub(r'[^A-Za-z0-9._-]', '_', model)}"


async def index_corpus(
    core: IngestCore,
    corpus: Mapping[str, str],
    *,
    collection: str,
    model: str,
    chunk: int = 256,
    on_chunk: Callable[[int], None] | None = None,
) -> None:
    """Embed and store every passage; raise EvalError if any could not be."""
    rejected: list[str] = []

    async def dead_letter(poisons: Sequence[tuple[RawRecord, str]]) -> None:
        rejected.extend(reason for _, reason in poisons)

    items = list(corpus.items())
    for start in range(0, len(items), chunk):
        records = [
            RawRecord(
                None,
                json.dumps(
                    {"id": doc_id, "text": text, "collection": collection, "model": model},
                    ensure_ascii=False,
                ).encode(),
                (),
                SourceRef("eval-corpus", 0, start + n),
            )
            for n, (doc_id, text) in enumerate(items[start : start + chunk])
        ]
        await core.process(records, dead_letter)
        if on_chunk is not None:
            on_chunk(len(records))
        if rejected:
            raise EvalError(
                f"{model}: {len(rejected)} passages could not be embedded, first: {rejected[0]}"
            )


async def search_queries(
    core: IngestCore,
    store: VectorStore,
    queries: Mapping[str, str],
    *,
    collection: str,
    model: str,
    k: int = 100,
) -> dict[str, list[str]]:
    """Each query's top ``k`` document ids from the collection, best first."""
    qids = list(queries)
    vectors = await core.embedder.embed([(model, queries[q]) for q in qids], use="query")
    run: dict[str, list[str]] = {}
    for qid, vector in zip(qids, vectors, strict=True):
        if isinstance(vector, FlotillaError):
            raise EvalError(f"{model}: query {qid} could not be embedded: {vector.message}")
        hits = await store.search(collection, vector, limit=k)
        run[qid] = [str(hit.payload["doc_id"]) for hit in hits]
    return run


@dataclass(slots=True)
class SystemResult:
    name: str
    kind: str  # "bm25" or "dense"
    metrics: dict[str, float]
    per_query: dict[str, dict[str, float]]
    collection: str | None = None
    timings_s: dict[str, float] = field(default_factory=dict)


def score(
    name: str, kind: str, run: Mapping[str, Sequence[str]], qrels: Qrels, **extra: Any
) -> SystemResult:
    return SystemResult(name, kind, evaluate(run, qrels), per_query(run, qrels), **extra)


async def dense_system(
    core: IngestCore,
    store: VectorStore,
    corpus: Mapping[str, str],
    queries: Mapping[str, str],
    qrels: Qrels,
    *,
    collection: str,
    model: str,
    on_chunk: Callable[[int], None] | None = None,
) -> SystemResult:
    target = collection_for(collection, model)
    started = time.perf_counter()
    await index_corpus(core, corpus, collection=target, model=model, on_chunk=on_chunk)
    indexed = time.perf_counter()
    run = await search_queries(core, store, queries, collection=target, model=model)
    searched = time.perf_counter()
    return score(
        model,
        "dense",
        run,
        qrels,
        collection=target,
        timings_s={"index": indexed - started, "queries": searched - indexed},
    )


_HEADERS = {"ndcg@10": "nDCG@10", "recall@10": "R@10", "recall@100": "R@100", "mrr@10": "MRR@10"}


def table(results: Sequence[SystemResult]) -> str:
    """Systems side by side; the last column compares nDCG@10 with the first dense model."""
    first = next((r for r in results if r.kind == "dense"), None)
    width = max([len("system"), *(len(r.name) for r in results)])
    head = f"{'system':<{width}}  " + "  ".join(f"{_HEADERS[m]:>8}" for m in METRICS)
    if first is not None:
        head += f"  {'Δ nDCG@10':>9}"
    lines = [head, "-" * len(head)]
    for r in results:
        row = f"{r.name:<{width}}  " + "  ".join(f"{r.metrics[m]:>8.4f}" for m in METRICS)
        if first is not None:
            delta = r.metrics["ndcg@10"] - first.metrics["ndcg@10"]
            row += f"  {delta:>+9.4f}" if r is not first else f"  {'':>9}"
        lines.append(row)
    return "\n".join(lines)


def report(
    results: Sequence[SystemResult], *, collection: str, corpus: int, queries: int
) -> dict[str, Any]:
    return {
        "collection": collection,
        "corpus": corpus,
        "queries": queries,
        "metrics": list(METRICS),
        "systems": [
            {
                "name": r.name,
                "kind": r.kind,
                "collection": r.collection,
                "metrics": r.metrics,
                "timings_s": r.timings_s,
            }
            for r in results
        ],
        "per_query": {r.name: r.per_query for r in results},
    }
