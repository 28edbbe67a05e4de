"""Running one formed batch: decode each job, tokenize, one forward, encode replies.

This is the blocking part of the worker loop; it runs in the device's
executor thread. A job with bad input fails alone; a failure of the forward
pass fails every job of the batch with the same error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from embedder.adapters import AdapterCatalog, ResidentAdapters
from embedder.batching import BatchLimits
from embedder.codecs import (
    EmbedRequest,
    RequestLimits,
    RerankRequest,
    decode_embed,
    decode_rerank,
    encode_embed,
    encode_rerank,
    shape_vectors,
)
from embedder.errors import AdapterNotFound, FlotillaError, InferenceFailed, LimitExceeded
from embedder.fleet import ModelSpec
from embedder.jobs import EmbedJob, JobResult, Task, Timings
from embedder.queue import Outcome
from embedder.runtimes import Encoded, Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedModel:
    spec: ModelSpec
    runtime: Runtime
    limits: BatchLimits
    catalog: AdapterCatalog | None = None  # None: this model serves no adapters
    resident: ResidentAdapters | None = None


@dataclass(frozen=True, slots=True)
class BatchReport:
    outcomes: list[tuple[EmbedJob, Outcome]]
    tokens: int
    inference_s: float


def _check_lengths(lengths: Sequence[int], truncate: bool, max_tokens: int, field: str) -> None:
    if truncate:
        return
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise LimitExceeded(
                f"{field.format(i=i)} has {n} tokens, over this model's limit of {max_tokens}: "
                'shorten it, send "truncate": true (TEI routes), or start the server with '
                "--auto-truncate (FLOTILLA_AUTO_TRUNCATE)"
            )


def _prepare(
    job: EmbedJob, model: LoadedModel, limits: RequestLimits
) -> tuple[EmbedRequest | RerankRequest, Encoded]:
    runtime = model.runtime
    spec = model.spec
    max_tokens = runtime.info.max_tokens
    if job.task is Task.EMBED:
        request = decode_embed(job.shape, job.body, limits)
        prefix = spec.prompt_prefix(request.prompt_name, request.use)  # unknown name: 422
        # The prompt's tokens count towards the limit: a text that fits alone may not.
        encoded = runtime.tokenize(request.texts, request.side, prefix=prefix)
        _check_lengths(encoded.full_lengths, request.truncate, max_tokens, "input {i}")
        return request, encoded
    rerank = decode_rerank(job.shape, job.body, limits)
    if runtime.info.kind == "cross-encoder":
        encoded = runtime.tokenize_pairs(rerank.query, rerank.documents, rerank.side)
        _check_lengths(encoded.full_lengths, rerank.truncate, max_tokens, "query + document {i}")
    else:  # a bi-encoder reranks by cosine: the query is the first input
        encoded = Encoded.concat(
            [
                runtime.tokenize(
                    [rerank.query], rerank.side, prefix=spec.prompt_prefix(use="query")
                ),
                runtime.tokenize(
                    rerank.documents, rerank.side, prefix=spec.prompt_prefix(use="document")
                ),
            ]
        )
        _check_lengths(encoded.full_lengths[:1], rerank.truncate, max_tokens, "the query")
        _check_lengths(encoded.full_lengths[1:], rerank.truncate, max_tokens, "document {i}")
    return rerank, encoded


def _scores(
    model: LoadedModel, out: NDArray[np.float32], request: RerankRequest
) -> NDArray[np.float32]:
    if model.runtime.info.kind == "cross-encoder":
        return out if request.raw_scores else (1.0 / (1.0 + np.exp(-out))).astype(np.float32)
    unit = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    scores: NDArray[np.float32] = (unit[1:] @ unit[0]).astype(np.float32)
    return scores


def _load_adapters(model: LoadedModel, names: set[str]) -> dict[str, FlotillaError]:
    """Make the batch's adapters resident (hot-loading new ones); returns those that
    cannot serve, whose jobs then fail alone."""
    if model.catalog is None or model.resident is None:
        return {
            name: AdapterNotFound(f"model {model.spec.name!r} serves no adapters") for name in names
        }
    failed: dict[str, FlotillaError] = {}
    folders: dict[str, Path] = {}
    for name in names:
        try:
            folders[name] = model.catalog.find(model.spec.name, name)
        except FlotillaError as exc:
            failed[name] = exc
    return failed | model.resident.ensure(folders)


def run_batch(
    batch: Sequence[EmbedJob], model: LoadedModel, limits: RequestLimits, now: float
) -> BatchReport:
    outcomes: list[tuple[EmbedJob, Outcome]] = []
    prepared: list[tuple[EmbedJob, EmbedRequest | RerankRequest, Encoded]] = []
    for job in batch:
        try:
            request, encoded = _prepare(job, model, limits)
        except FlotillaError as exc:
            outcomes.append((job, exc))
        else:
            prepared.append((job, request, encoded))
    if wanted := {job.adapter for job, _, _ in prepared if job.adapter is not None}:
        failed = _load_adapters(model, wanted)
        outcomes += [(job, failed[job.adapter]) for job, _, _ in prepared if job.adapter in failed]
        prepared = [item for item in prepared if item[0].adapter not in failed]
    if not prepared:
        return BatchReport(outcomes, 0, 0.0)

    merged = Encoded.concat([encoded for _, _, encoded in prepared])
    row_adapters = [job.adapter for job, _, encoded in prepared for _ in range(len(encoded))]
    start = time.perf_counter()
    try:
        out = model.runtime.forward(merged, row_adapters if any(row_adapters) else None)
    except Exception as exc:  # any model failure reaches every waiting request
        log.exception("batch of %d jobs failed on %s", len(prepared), model.spec.name)
        error = InferenceFailed(f"model {model.spec.name!r} failed on this batch: {exc!r}")
        return BatchReport(outcomes + [(job, error) for job, _, _ in prepared], 0, 0.0)
    inference_s = time.perf_counter() - start

    offset = 0
    for job, request, encoded in prepared:
        rows = out[offset : offset + len(encoded)]
        offset += len(encoded)
        timings = Timings(queue_s=max(0.0, now - job.enqueued_at), inference_s=inference_s)
        try:
            if isinstance(request, EmbedRequest):
                vectors = shape_vectors(rows, request, model.spec.normalize)
                body = encode_embed(job.shape, request, vectors, model.spec.name, encoded.tokens)
            else:
                scores = _scores(model, rows, request)
                body = encode_rerank(
                    job.shape, request, scores, model.spec.name, encoded.tokens, job.id
                )
        except FlotillaError as exc:
            outcomes.append((job, exc))
            continue
        outcomes.append((job, JobResult(body=body, prompt_tokens=encoded.tokens, timings=timings)))
    return BatchReport(outcomes, merged.tokens, inference_s)
