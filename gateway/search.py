"""``POST /v1/collections/{name}/search``: query text -> embedded by the collection's own
model through the queue -> top-k points from the vector store, with payloads.

Closes the loop for users and evaluations: what the pipeline wrote, the gateway finds.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from embedder.codecs import decode_raw_vectors, raw_vectors_body
from embedder.errors import InvalidRequest
from embedder.jobs import ApiShape, EmbedJob, split_model
from gateway.service import Gateway
from ingest.store import VectorStore

MAX_LIMIT = 1000


class _SearchBody(msgspec.Struct, forbid_unknown_fields=True):
    query: str
    limit: int = 10
    filter: dict[str, Any] | None = None


class CollectionSearch:
    def __init__(self, gateway: Gateway, store: VectorStore) -> None:
        self.gateway = gateway
        self.store = store

    async def handle(self, request: Request, collection: str) -> Response:
        gateway = self.gateway
        now = gateway.clock()
        gateway.authorize(request)
        body = self._decode(await gateway.read_body(request))
        spec = await self.store.describe(collection)  # CollectionNotFound: 404
        model, adapter = split_model(spec.model)  # a collection may be embedded with an adapter
        gateway.check_ready(model)
        job = EmbedJob.new(
            model,
            ApiShape.RAW_VECTORS,
            # A query longer than the model's window is cut rather than refused; a model
            # with prompts gets its query prompt (e5: "query: ") before it.
            raw_vectors_body([body.query], truncate=True, use="query"),
            now=now,
            timeout_s=gateway.timeout_s(request),
            bytes_per_token=gateway.settings.bytes_per_token,
            priority=gateway.priority(request),
            adapter=adapter,
        )
        result = await gateway.run(request, job)
        vector = decode_raw_vectors(result.body, 1)[0]
        hits = await self.store.search(collection, vector, body.limit, body.filter)
        return JSONResponse(
            {
                "collection": collection,
                "model": spec.model,
                "results": [{"id": h.id, "score": h.score, "payload": h.payload} for h in hits],
                "usage": {"prompt_tokens": result.prompt_tokens},
            },
            headers={
                "x-queue-time": f"{result.timings.queue_s * 1e3:.2f}",
                "x-inference-time": f"{result.timings.inference_s * 1e3:.2f}",
                "x-total-time": f"{(gateway.clock() - now) * 1e3:.2f}",
            },
        )

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
