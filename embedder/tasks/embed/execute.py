"""Running one formed batch: decode each job, tokenize, one forward, encode replies.

Three blocking stages, each a function: ``prepare_batch`` (decode + tokenize, host
work), ``forward_batch`` (adapters and the forward pass, the device's work) and
``finish_batch`` (shape and encode the replies, host work), so the worker can run
host work for one batch while the device runs another (``embedder.tasks.embed.pipeline``);
``run_batch`` runs all three in a row. A job with bad input fails alone; a failure of
the forward pass fails every job of the batch with the same error.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

import embedder.tasks.rerank.codecs as rerank_codecs
from embedder.core.adapters import AdapterCatalog, ResidentAdapters
from embedder.core.errors import (
    AdapterBuilding,
    AdapterNotFound,
    FlotillaError,
    InferenceFailed,
    LimitExceeded,
)
from embedder.core.jobs import ApiShape, Job, JobResult, Task, Timings, TruncationSide
from embedder.queue import Outcome
from embedder.tasks.embed.batching import BatchLimits
from embedder.tasks.embed.codecs import EmbedRequest, RequestLimits, shape_vectors
from embedder.tasks.embed.cohere_v2 import check_window
from embedder.tasks.embed.runtimes import Encoded, Runtime
from embedder.tasks.embed.shapes import decode_embed, encode_embed
from embedder.tasks.embed.spec import EncoderSpec
from embedder.tasks.rerank.codecs import RerankRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedModel:
    spec: EncoderSpec
    runtime: Runtime
    limits: BatchLimits
    catalog: AdapterCatalog | None = None  # None: this model serves no adapters
    resident: ResidentAdapters | None = None


@dataclass(frozen=True, slots=True)
class BatchReport:
    outcomes: list[tuple[Job, Outcome]]
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


# Characters per token a text keeps when it is cut before tokenizing (truncation only).
# Tokenizing costs time in proportion to the text, and all but the window is thrown away:
# a 4 MB text would tokenize for about a second to keep 256 tokens. Real text runs 3 to 6
# characters a token, so the cut keeps the same window; only text that is mostly
# whitespace or 30+-character words would keep fewer tokens than the window holds.
CUT_CHARS_PER_TOKEN = 32


def _cut(texts: Sequence[str], side: TruncationSide, max_tokens: int) -> list[str]:
    room = max_tokens * CUT_CHARS_PER_TOKEN
    return [
        text if len(text) <= room else text[:room] if side == "right" else text[-room:]
        for text in texts
    ]


def _prepare(
    job: Job, model: LoadedModel, limits: RequestLimits
) -> tuple[EmbedRequest | RerankRequest, Encoded]:
    runtime = model.runtime
    spec = model.spec
    max_tokens = runtime.info.max_tokens
    if job.task == Task.EMBED:
        request = decode_embed(ApiShape(job.shape), job.body, limits)
        check_window(request, max_tokens)
        side = request.side
        texts = _cut(request.texts, side, max_tokens) if request.truncate else request.texts
        prefix = spec.prompt_prefix(request.prompt_name, request.use)  # unknown name: 422
        # The prompt's tokens count towards the limit: a text that fits alone may not.
        encoded = runtime.tokenize(texts, side, prefix=prefix)
        _check_lengths(encoded.full_lengths, request.truncate, max_tokens, "input {i}")
        return request, encoded
    rerank = rerank_codecs.decode(ApiShape(job.shape), job.body, limits)
    rerank_codecs.check_window(rerank, max_tokens)
    side = rerank.side
    query, docs = rerank.query, rerank.documents  # the request keeps them whole (return_text)
    if rerank.truncate:
        query, docs = _cut([query], side, max_tokens)[0], _cut(docs, side, max_tokens)
    if runtime.info.kind == "cross-encoder":
        encoded = runtime.tokenize_pairs(query, docs, side)
        _check_lengths(encoded.full_lengths, rerank.truncate, max_tokens, "query + document {i}")
    else:  # a bi-encoder reranks by cosine: the query is the first input
        encoded = Encoded.concat(
            [
                runtime.tokenize([query], side, prefix=spec.prompt_prefix(use="query")),
                runtime.tokenize(docs, side, prefix=spec.prompt_prefix(use="document")),
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


@dataclass(frozen=True, slots=True)
class Prepared:
    """A batch decoded and tokenized (host work): what the device is to run, and the jobs
    that already failed on their own input."""

    items: list[tuple[Job, EmbedRequest | RerankRequest, Encoded]]
    failed: list[tuple[Job, Outcome]]

    @property
    def tokens(self) -> int:
        return sum(encoded.tokens for _, _, encoded in self.items)

    def without(self, withdrawn: set[str]) -> Prepared:
        """The batch less the jobs nobody waits for any more (no outcome is due to them)."""
        if not withdrawn:
            return self
        return Prepared(
            [item for item in self.items if item[0].id not in withdrawn],
            [item for item in self.failed if item[0].id not in withdrawn],
        )


@dataclass(frozen=True, slots=True)
class Forwarded:
    """A batch after the device: its output rows, or the error every job of it gets;
    ``waiting``: jobs left out because their adapter is still being built (the pipeline
    runs them once it is ready; without one they get the error, a retriable 503)."""

    prepared: Prepared
    out: NDArray[np.float32] | None
    error: FlotillaError | None
    tokens: int
    inference_s: float
    waiting: tuple[tuple[Job, AdapterBuilding], ...] = ()


def prepare_batch(batch: Sequence[Job], model: LoadedModel, limits: RequestLimits) -> Prepared:
    """Decode and tokenize every job; a job with bad input fails alone."""
    failed: list[tuple[Job, Outcome]] = []
    items: list[tuple[Job, EmbedRequest | RerankRequest, Encoded]] = []
    for job in batch:
        try:
            request, encoded = _prepare(job, model, limits)
        except FlotillaError as exc:
            failed.append((job, exc))
        else:
            items.append((job, request, encoded))
    return Prepared(items, failed)


def forward_batch(prepared: Prepared, model: LoadedModel) -> Forwarded:
    """Make the batch's adapters resident, then one forward over all its inputs. The
    device's part: adapters change the model, so this never runs beside another forward."""
    items, failed = prepared.items, list(prepared.failed)
    if not items:
        return Forwarded(prepared, None, None, 0, 0.0)
    waiting: list[tuple[Job, AdapterBuilding]] = []
    if wanted := {job.adapter for job, _, _ in items if job.adapter is not None}:
        unusable = _load_adapters(model, wanted)
        for job, _, _ in items:
            error = unusable.get(job.adapter) if job.adapter is not None else None
            if isinstance(error, AdapterBuilding):
                waiting.append((job, error))
            elif error is not None:
                failed.append((job, error))
        items = [item for item in items if item[0].adapter not in unusable]
        prepared = Prepared(items, failed)
        if not items:
            return Forwarded(prepared, None, None, 0, 0.0, tuple(waiting))
    forwarded = _forward(prepared, model)
    return dataclasses.replace(forwarded, waiting=tuple(waiting)) if waiting else forwarded


def _forward(prepared: Prepared, model: LoadedModel) -> Forwarded:
    items = prepared.items
    merged = Encoded.concat([encoded for _, _, encoded in items])
    row_adapters = [job.adapter for job, _, encoded in items for _ in range(len(encoded))]
    start = time.perf_counter()
    try:
        out = model.runtime.forward(merged, row_adapters if any(row_adapters) else None)
    except Exception as exc:  # any model failure reaches every waiting request
        log.exception("batch of %d jobs failed on %s", len(items), model.spec.name)
        error = InferenceFailed(f"model {model.spec.name!r} failed on this batch: {exc!r}")
        return Forwarded(prepared, None, error, 0, 0.0)
    return Forwarded(prepared, out, None, merged.tokens, time.perf_counter() - start)


def finish_batch(forwarded: Forwarded, model: LoadedModel, now: float) -> BatchReport:
    """Shape and encode each job's reply from its rows (host work); ``now`` is when the
    batch left the queue, for each job's queue time."""
    prepared = forwarded.prepared
    outcomes: list[tuple[Job, Outcome]] = [*prepared.failed, *forwarded.waiting]
    if forwarded.error is not None:
        outcomes += [(job, forwarded.error) for job, _, _ in prepared.items]
        return BatchReport(outcomes, 0, 0.0)
    out = forwarded.out
    if out is None:
        return BatchReport(outcomes, 0, 0.0)
    inference_s = forwarded.inference_s
    offset = 0
    for job, request, encoded in prepared.items:
        rows = out[offset : offset + len(encoded)]
        offset += len(encoded)
        timings = Timings(queue_s=max(0.0, now - job.enqueued_at), inference_s=inference_s)
        try:
            if isinstance(request, EmbedRequest):
                vectors = shape_vectors(rows, request, model.spec.normalize)
                body = encode_embed(
                    ApiShape(job.shape), request, vectors, model.spec.name, encoded.tokens, job.id
                )
            else:
                scores = _scores(model, rows, request)
                body = rerank_codecs.encode(
                    ApiShape(job.shape), request, scores, model.spec.name, encoded.tokens, job.id
                )
        except FlotillaError as exc:
            outcomes.append((job, exc))
            continue
        outcomes.append((job, JobResult(body=body, prompt_tokens=encoded.tokens, timings=timings)))
    return BatchReport(outcomes, forwarded.tokens, inference_s)


def run_batch(
    batch: Sequence[Job], model: LoadedModel, limits: RequestLimits, now: float
) -> BatchReport:
    """All three stages in the calling thread: decode + tokenize, forward, encode."""
    prepared = prepare_batch(batch, model, limits)
    return finish_batch(forward_batch(prepared, model), model, now)
