"""`flotilla eval retrieval`: the BM25 baseline, then each model through the local stack
(``flotilla.wiring``: the model host, the in-process queue, the ingest core and the
configured store), as `flotilla ingest` runs them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flotilla import wiring
from flotilla.progress import Progress
from flotilla.settings import Settings
from ingest.store import VectorStore
from lora.compare import compare, describe
from lora.dataset import read_corpus, read_qrels, read_queries
from lora.evaluate import SystemResult, dense_system, report, score, table


async def retrieval(
    settings: Settings,
    *,
    corpus_path: Path,
    queries_path: Path,
    qrels_path: Path,
    models: Sequence[str],
    bm25: bool = True,
    bm25_language: str = "de",
    out: Path | None = None,
    store: VectorStore | None = None,
) -> dict[str, Any]:
    corpus = read_corpus(corpus_path)
    qrels = read_qrels(qrels_path)
    queries = {qid: text for qid, text in read_queries(queries_path).items() if qid in qrels}
    if not queries:
        raise SystemExit(f"no query in {queries_path} has a judgement in {qrels_path}")
    results: list[SystemResult] = []
    if bm25:
        from lora.bm25 import bm25_run

        started = time.perf_counter()
        run = bm25_run(corpus, queries, language=bm25_language)
        results.append(
            score("bm25", "bm25", run, qrels, timings_s={"all": time.perf_counter() - started})
        )
    if models:
        # Passages longer than a model's window are cut, as search cuts queries: an
        # evaluation scores every passage (one point each, as its judgements are per
        # passage) rather than refusing or splitting the long ones.
        settings = settings.updated(auto_truncate=True, chunking=False)
        # Only the models evaluated are loaded (an adapter's base for 'model:adapter').
        async with wiring.running_stack(settings, store=store, models=models) as stack:
            for model in models:
                progress = Progress(
                    f"{model}: corpus",
                    len(corpus),
                    unit="passages",
                    outcomes=False,
                    interval_s=settings.progress_interval_s,
                )
                async with progress:
                    result = await dense_system(
                        stack.core,
                        stack.store,
                        corpus,
                        queries,
                        qrels,
                        collection=settings.ingest.collection,
                        model=model,
                        on_chunk=progress.advance,
                    )
                results.append(result)
    print(table(results))
    # each dense model against the first: the lift, its interval, and per law
    dense = [r for r in results if r.kind == "dense"]
    comparisons = [
        compare((dense[0].name, dense[0].per_query), (r.name, r.per_query), qrels)
        for r in dense[1:]
    ]
    for c in comparisons:
        print(describe(c))
    document = report(
        results, collection=settings.ingest.collection, corpus=len(corpus), queries=len(queries)
    ) | {"comparisons": [c.as_dict() for c in comparisons]}
    if out is not None:
        await asyncio.to_thread(_write, out, json.dumps(document, indent=2) + "\n")
        print(f"report: {out}")
    return document


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
