"""``POST /v1/collections/{name}/search``: query text -> embedded by the collection's own
model through the queue -> top-k points from the vector store, with payloads.

Closes the loop for users and evaluations: what the pipeline wrote, the gateway finds.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgspec
from starlette.requests import Request

from embedder.tasks.embed.codecs import decode_raw_vectors, raw_vectors_body
from embedder.core.errors import InvalidRequest
from embedder.core.jobs import ApiShape, Job, JobResult, split_model
from embedder.core.rawjson import estimate_tokens
from gateway.service import Gateway
from ingest.store import VectorStore

MAX_LIMIT = 1000


class _SearchBody(msgspec.Struct, forbid_unknown_fields=True):
    query: str
    limit: int = 10
    filter: dict[str, Any] | None = None


class CollectionSearch:
    """One search request on the gateway's request path (``Gateway.handle``): the query
    becomes a raw-vectors job for the collection's model, and the worker's vector a
    search in the store. Made per request: it keeps the decoded body for the answer."""

    def __init__(self, store: VectorStore, collection: str) -> None:
        self.store = store
        self.collection = collection
        self.model = ""
        self.search = _SearchBody(query="")

    async def job(self, gateway: Gateway, request: Request, body: bytes, now: float) -> Job:
        self.search = search = self._decode(body)
        spec = await self.store.describe(self.collection)  # CollectionNotFound: 404
        self.model = spec.model
        model, adapter = split_model(spec.model)  # a collection may be embedded with an adapter
        # A query longer than the model's window is cut rather than refused; a model
        # with prompts gets its query prompt (e5: "query: ") before it.
        query = raw_vectors_body([search.query], truncate=True, use="query")
        bytes_per_token = gateway.config.bytes_per_token
        served = gateway.fleet.models.get(model)  # None: check_ready answers for it
        tokens = estimate_tokens(query, bytes_per_token, served.max_tokens) if served else None
        job = Job.new(
            model,
            ApiShape.RAW_VECTORS,
            query,
            now=now,
            timeout_s=gateway.timeout_s(request),
            bytes_per_token=bytes_per_token,
            priority=gateway.priority(request),
            adapter=adapter,
            est_tokens=tokens,
        )
        return job

    async def respond(self, job: Job, result: JobResult) -> JobResult:
        vector = decode_raw_vectors(result.body, 1)[0]
        search = self.search
        hits = await self.store.search(self.collection, vector, search.limit, search.filter)
        body = {
            "collection": self.collection,
            "model": self.model,
            "results": [{"id": h.id, "score": h.score, "payload": h.payload} for h in hits],
            "usage": {"prompt_tokens": result.prompt_tokens},
        }
        return replace(result, body=msgspec.json.encode(body), media_type="application/json")

    @staticmethod
    def _decode(body: bytes) -> _SearchBody:
        try:
            search = msgspec.json.decode(body, type=_SearchBody)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InvalidRequest(
                f'invalid search body: {exc}; send {{"query": str, "limit"?: int, '
                '"filter"?: {payload.path: value | [values]}}'
            ) from exc
        if not search.query.strip():
            raise InvalidRequest("'query' must not be empty")
        if not 1 <= search.limit <= MAX_LIMIT:
            raise InvalidRequest(f"'limit' must be between 1 and {MAX_LIMIT}, got {search.limit}")
        return search
