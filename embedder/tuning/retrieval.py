"""Retrieval quality through a runtime: a labelled set (queries, passages, judgements)
embedded by the candidate and ranked by cosine. The metric comes from the caller
(``lora.metrics``' nDCG@10 in ``flotilla tune``), so this package stays below it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from embedder.core.fleet import ModelSpec
from embedder.tasks.embed.runtimes import Encoded, Runtime

Run = Mapping[str, Sequence[str]]
Qrels = Mapping[str, Mapping[str, int]]
Metric = Callable[[Run, Qrels], float]
CHUNK = 64  # texts per forward call: any size gives the same vectors


@dataclass(frozen=True, slots=True)
class LabelledSet:
    name: str  # what it is, for the report
    queries: Mapping[str, str]
    corpus: Mapping[str, str]
    qrels: Qrels
    metric: Metric  # nDCG@10 of a run against qrels


def embed(runtime: Runtime, texts: Sequence[str], prefix: str) -> NDArray[np.float32]:
    parts: list[NDArray[np.float32]] = []
    for start in range(0, len(texts), CHUNK):
        encoded: Encoded = runtime.tokenize(texts[start : start + CHUNK], "right", prefix)
        parts.append(runtime.forward(encoded))
    vectors = np.concatenate(parts)
    norms = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    unit: NDArray[np.float32] = (vectors / norms).astype(np.float32)
    return unit


def ndcg(runtime: Runtime, spec: ModelSpec, labelled: LabelledSet, k: int = 10) -> float:
    """The metric of this runtime's ranking, with the model's query and document prompts."""
    qids, dids = list(labelled.queries), list(labelled.corpus)
    q = embed(runtime, [labelled.queries[i] for i in qids], spec.prompt_prefix(use="query"))
    d = embed(runtime, [labelled.corpus[i] for i in dids], spec.prompt_prefix(use="document"))
    top = np.argsort(-(q @ d.T), axis=1)[:, :k]
    run = {qid: [dids[j] for j in row] for qid, row in zip(qids, top, strict=True)}
    return labelled.metric(run, labelled.qrels)
