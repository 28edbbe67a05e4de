"""The documents routes: how documents reach a collection that this server owns.

- ``POST /v1/collections/{name}/documents`` ``{"documents": [{"id", "text",
  "metadata"?}, ...], "model"?}`` upserts a batch;
- ``POST /v1/collections/{name}/documents/delete`` ``{"ids": [...]}`` deletes a batch;
- ``DELETE /v1/collections/{name}/documents/{id}`` deletes one.

Every batch goes through the same ``IngestCore`` as Kafka ingest and file backfill: one
record contract (``ingest.records``: a document here is a record's JSON value, the
collection comes from the path), point ids derived from (collection, document id), so
sending a batch again writes the same points. As with Elasticsearch's ``_bulk`` and
Weaviate's batch API, a bad document does not fail its batch: the answer (200) lists
each document's outcome, the good ones stored and each bad one with its reason. Only
what concerns the whole request (auth, body, limits, an unknown model or collection, a
loading model, the store) is an error in the route's error shape.

One model embeds a request's documents: ``model`` when given, else the collection's own,
else the server's default (the collection takes the first model it is written with).
The route admits its estimated tokens against a budget of ``--max-inflight-tokens`` per
model of its own, so a burst of documents gets 429 with Retry-After instead of queueing
without bound, and never takes the budget of online requests.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from embedder.core.errors import FlotillaError, InvalidRequest, LimitExceeded, ModelNotFound
from embedder.core.jobs import split_model
from embedder.core.rawjson import check_depth
from embedder.tasks.ocr import api as ocr_api
from gateway import metrics
from gateway.answers import DocumentsDeleted
from gateway.openapi import ApiDocs
from gateway.schemas import DELETE, UPSERT
from gateway.service import Gateway
from ingest.pipeline import IngestCore, RawRecord
from ingest.records import COLLECTION_HEADER, MODEL_HEADER, SourceRef
from ingest.store import CollectionModelMismatch, CollectionNotFound, CollectionSpec

_Body = TypeVar("_Body", bound=msgspec.Struct)

SOURCE = "http"  # what the points' payload.source.topic says of documents sent here


class _UpsertBody(msgspec.Struct, forbid_unknown_fields=True):
    documents: list[msgspec.Raw]
    model: str | None = None


class _DeleteBody(msgspec.Struct, forbid_unknown_fields=True):
    ids: list[str]


class _Id(msgspec.Struct):
    id: Any = None


UPSERT_SHAPE = '{"documents": [{"id": str, "text": str, "metadata"?: object}, ...], "model"?: str}'


class CollectionDocuments:
    """The documents routes of one app, over the ingest core that owns the store."""

    def __init__(self, gateway: Gateway, core: IngestCore) -> None:
        self.gateway = gateway
        self.core = core

    async def upsert(self, request: Request, collection: str) -> Response:
        with self._counted(request) as seen:
            self.gateway.authorize(request)
            body = await self.gateway.read_body(request)
            check_depth(body)
            upsert = self._decode(body, _UpsertBody, UPSERT_SHAPE)
            self._check_count(len(upsert.documents), "documents")
            spec = await self._existing(collection)
            seen["model"] = model = self._model(upsert.model, spec)
            deadline = self.gateway.clock() + self.gateway.timeout_s(request)
            self.gateway.check_ready(split_model(model)[0], deadline)
            headers = ((COLLECTION_HEADER, collection.encode()), (MODEL_HEADER, model.encode()))
            records = [
                RawRecord(None, bytes(raw), headers, SourceRef(SOURCE, 0, index))
                for index, raw in enumerate(upsert.documents)
            ]
            with self._admitted(model, upsert.documents):
                failed = await self._process(records)
            results = [
                _outcome(index, _document_id(raw), failed.get(index), "upserted")
                for index, raw in enumerate(upsert.documents)
            ]
            return _answer(collection, "upserted", results, model=model)

    async def delete_many(self, request: Request, collection: str) -> Response:
        with self._counted(request):
            self.gateway.authorize(request)
            body = await self.gateway.read_body(request)
            check_depth(body)
            ids = self._decode(body, _DeleteBody, '{"ids": [str, ...]}').ids
            self._check_count(len(ids), "ids")
            return await self._delete(collection, ids)

    async def delete_one(self, request: Request, collection: str, doc_id: str) -> Response:
        with self._counted(request):
            self.gateway.authorize(request)
            return await self._delete(collection, [doc_id])

    async def _delete(self, collection: str, ids: Sequence[str]) -> Response:
        if await self._existing(collection) is None:
            raise CollectionNotFound(f"collection {collection!r} not found")
        headers = ((COLLECTION_HEADER, collection.encode()),)
        records = [
            RawRecord(doc_id.encode(), None, headers, SourceRef(SOURCE, 0, index))
            for index, doc_id in enumerate(ids)
        ]
        failed = await self._process(records)
        results = [
            _outcome(index, doc_id, failed.get(index), "deleted")
            for index, doc_id in enumerate(ids)
        ]
        return _answer(collection, "deleted", results)

    async def _process(self, records: list[RawRecord]) -> dict[int, str]:
        """The batch through the ingest core; the reason of each document it refused, by
        its position in the request. Nothing is dead-lettered: the answer carries them."""

        async def keep(_: Sequence[tuple[RawRecord, str]]) -> None:
            return None

        report = await self.core.process(records, keep)
        return {record.source.offset: reason for record, reason in report.poisons}

    async def _existing(self, collection: str) -> CollectionSpec | None:
        """The collection's spec (opening it; the name is checked), None if it is new."""
        try:
            return await self.core.store.describe(collection)
        except CollectionNotFound:
            return None

    def _model(self, asked: str | None, spec: CollectionSpec | None) -> str:
        if asked is None:
            if spec is None:
                return self.core.rules.default_model
            if self.core.rules.resolve_model(spec.model) is None:
                raise ModelNotFound(
                    f"collection {spec.name!r} holds vectors of {spec.model!r}, which this "
                    "server does not serve: serve that model, or write into another collection"
                )
            return spec.model
        model = self.core.rules.resolve_model(asked)
        if model is None:
            raise ModelNotFound(
                f"model {asked!r} is not served here; available: "
                + ", ".join(sorted(self.gateway.fleet.models))
            )
        if spec is not None and spec.model != model:
            raise CollectionModelMismatch(
                f"collection {spec.name!r} holds vectors of {spec.model!r}, not {model!r}: "
                "leave 'model' out, or write into another collection"
            )
        return model

    def _check_count(self, count: int, what: str) -> None:
        limit = self.gateway.config.max_documents_per_request
        if count == 0:
            raise InvalidRequest(f"'{what}' is empty; send at least one")
        if count > limit:
            raise LimitExceeded(
                f"{count} {what} in one request, more than {limit}: send smaller batches, or "
                "raise --ingest-max-records (FLOTILLA_INGEST_MAX_RECORDS)"
            )

    @staticmethod
    def _decode(body: bytes, shape: type[_Body], expected: str) -> _Body:
        try:
            return msgspec.json.decode(body, type=shape)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InvalidRequest(f"invalid body: {exc}; send {expected}") from exc
        except RecursionError as exc:  # msgspec's own depth limit
            raise InvalidRequest(f"the body nests too deeply; send {expected}") from exc

    @contextlib.contextmanager
    def _admitted(self, model: str, documents: Sequence[msgspec.Raw]) -> Iterator[None]:
        gateway = self.gateway
        budget = f"{model} (documents)"  # a budget apart from the model's online requests
        tokens = sum(self._tokens(bytes(raw)) for raw in documents)
        with gateway.admission.admit(budget, tokens):
            yield

    def _tokens(self, raw: bytes) -> int:
        """A text document by its size; a scanned one (``document``) by its pages, as
        /v1/ocr counts it: its base64 is no measure of the text it holds."""
        config = self.gateway.config
        if b'"document"' in raw:
            with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError):
                routing = msgspec.json.decode(raw, type=ocr_api.Routing)
                if routing.document is not None:
                    return ocr_api.estimate_tokens(routing, len(raw), config.ocr.max_pages)
        return math.ceil(len(raw) / config.bytes_per_token)

    @staticmethod
    @contextlib.contextmanager
    def _counted(request: Request) -> Iterator[dict[str, str]]:
        """Count the request by route template and status, as every route is counted."""
        path = getattr(request.scope.get("route"), "path", request.url.path)
        seen = {"model": "unknown"}
        status = 500
        start = time.perf_counter()
        try:
            yield seen
            status = 200
        except FlotillaError as exc:
            status = exc.http_status
            raise
        finally:
            metrics.REQUESTS.labels(seen["model"], path, str(status)).inc()
            if status == 200:
                metrics.REQUEST_SECONDS.labels(seen["model"], path).observe(
                    time.perf_counter() - start
                )


def _document_id(raw: msgspec.Raw) -> str | None:
    """The id a document gives, for its line of the answer; the core judges it."""
    try:
        found = msgspec.json.decode(raw, type=_Id).id
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return found if isinstance(found, str) else None


def _outcome(index: int, doc_id: str | None, reason: str | None, done: str) -> dict[str, Any]:
    if reason is None:
        return {"index": index, "id": doc_id, "status": done}
    error = {"message": reason, "type": "document_rejected"}
    return {"index": index, "id": doc_id, "status": "failed", "error": error}


def _answer(
    collection: str, done: str, results: list[dict[str, Any]], **extra: str
) -> JSONResponse:
    failed = sum(1 for r in results if r["status"] == "failed")
    body = {
        "collection": collection,
        **extra,
        done: len(results) - failed,
        "failed": failed,
        "results": results,
    }
    return JSONResponse(body)


def add_document_routes(app: FastAPI, gateway: Gateway, core: IngestCore, docs: ApiDocs) -> None:
    documents = CollectionDocuments(gateway, core)
    upsert, delete = "/v1/collections/{name}/documents", "/v1/collections/{name}/documents/delete"
    one = "/v1/collections/{name}/documents/{doc_id:path}"

    @app.post(upsert, response_class=Response, **docs.route(upsert, UPSERT))
    async def upsert_documents(request: Request, name: str) -> Response:
        return await documents.upsert(request, name)

    @app.post(delete, response_class=Response, **docs.route(delete, DELETE))
    async def delete_documents(request: Request, name: str) -> Response:
        return await documents.delete_many(request, name)

    @app.delete(one, response_class=Response, **docs.answers(one, DocumentsDeleted))
    async def delete_document(request: Request, name: str, doc_id: str) -> Response:
        return await documents.delete_one(request, name, doc_id)
