"""`flotilla ingest --from FILE --server URL`: a file's documents sent to the documents
route of a running server (``gateway.documents``), the way in to collections that the
server owns. No model loads here: the server embeds with its own.

Lines are grouped by collection (a line's ``collection``, else --collection) and model
(a line's ``model``, else the collection's), and sent in batches of at most
--ingest-max-records documents and half the token budget a model admits at once
(--max-inflight-tokens x --bytes-per-token), within --max-body-bytes: the server's
limits when one environment configures both. Two batches are in flight, never two that
share a document id, so a file's later line of a document always lands last.

The server's answer per document is the truth: what it stored counts as stored, what
it refused goes to ``<file>.dlq.jsonl`` with its reason, as the backfill's dead letters
do. 429 and 503 are retried after their Retry-After (for up to ten minutes a batch); a
batch too large (413) or refused as a whole (422) is split until the document at fault
stands alone and is dead-lettered; a server that cannot be reached is retried with
backoff for two minutes, then the run fails.
Any other refusal ends the run with the server's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec

from embedder.core.errors import FlotillaError
from flotilla.ingest import DeadLetterFile, count_records, read_records
from flotilla.progress import Progress
from flotilla.settings import Settings
from ingest.pipeline import RawRecord
from ingest.store.contract import check_collection_name
from ingest.store.errors import InvalidStoreRequest

IN_FLIGHT = 2  # batches: one being embedded while the next crosses the network
MAX_RETRY_AFTER_S = 60.0
UNREACHABLE_DEADLINE_S = 120.0  # how long a server that went away is waited for
OVERLOADED_DEADLINE_S = 600.0  # how long one batch waits out 429 and 503 answers
TIMEOUT = httpx.Timeout(600.0, connect=10.0)  # a batch waits for the server's models


class ServerRefused(FlotillaError):
    """The server refused a request as a whole, or could not be reached."""

    code = "server_refused"


@dataclass(slots=True)
class Batch:
    collection: str
    model: str | None
    records: list[RawRecord] = field(default_factory=list)
    documents: list[bytes] = field(default_factory=list)  # each a JSON value
    ids: set[str] = field(default_factory=set)
    size: int = 0

    def body(self) -> bytes:
        model = b',"model":' + json.dumps(self.model).encode() if self.model else b""
        return b'{"documents":[' + b",".join(self.documents) + b"]" + model + b"}"

    def halves(self) -> tuple[Batch, Batch]:
        middle = len(self.records) // 2
        return self._part(slice(0, middle)), self._part(slice(middle, None))

    def _part(self, part: slice) -> Batch:
        batch = Batch(self.collection, self.model)
        for record, document in zip(self.records[part], self.documents[part], strict=True):
            batch.add(record, document, None)
        return batch

    def add(self, record: RawRecord, document: bytes, doc_id: str | None) -> None:
        self.records.append(record)
        self.documents.append(document)
        self.size += len(document) + 1
        if doc_id is not None:
            self.ids.add(doc_id)


class DocumentsClient:
    def __init__(self, settings: Settings, server: str, dead: DeadLetterFile) -> None:
        self.settings = settings
        self.server = server.rstrip("/")
        self.dead = dead
        self.max_documents = settings.ingest.max_records
        budget = settings.gateway.max_inflight_tokens * settings.bytes_per_token / 2
        self.max_bytes = int(min(settings.gateway.max_body_bytes, budget)) - 64  # the envelope
        headers = {"content-type": "application/json"}
        if settings.gateway.api_keys:
            headers["authorization"] = f"Bearer {settings.gateway.api_keys[0]}"
        self.http = httpx.AsyncClient(base_url=self.server, headers=headers, timeout=TIMEOUT)

    async def send_file(self, path: Path, progress: Progress) -> None:
        in_flight: dict[asyncio.Task[None], set[str]] = {}
        try:
            for batch in self._batches(path, progress):
                while len(in_flight) >= IN_FLIGHT or any(
                    ids & batch.ids for ids in in_flight.values()
                ):
                    await self._settle(in_flight)
                task = asyncio.create_task(self._send(batch, progress))
                in_flight[task] = batch.ids
            while in_flight:
                await self._settle(in_flight)
        finally:
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
            await self.http.aclose()

    @staticmethod
    async def _settle(in_flight: dict[asyncio.Task[None], set[str]]) -> None:
        done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            del in_flight[task]
            task.result()  # a failed batch ends the run

    def _batches(self, path: Path, progress: Progress) -> Iterator[Batch]:
        open_batches: dict[tuple[str, str | None], Batch] = {}
        for record in read_records(path):
            document, target, doc_id, refused = self._document(record)
            if refused is not None:
                self.dead.write([(record, refused)])
                progress.add(done=1, failed=1)
                continue
            batch = open_batches.get(target)
            if batch is not None and (
                len(batch.records) >= self.max_documents
                or batch.size + len(document) > self.max_bytes
            ):
                yield open_batches.pop(target)
                batch = None
            if batch is None:
                batch = open_batches[target] = Batch(*target)
            batch.add(record, document, doc_id)
        yield from open_batches.values()

    def _document(
        self, record: RawRecord
    ) -> tuple[bytes, tuple[str, str | None], str | None, str | None]:
        """A line as the JSON value to send, its (collection, model), its id, or why it
        cannot be sent. The server judges the document itself, as the backfill would."""
        value = record.value or b""
        target: tuple[str, str | None] = (self.settings.ingest.collection, None)
        try:
            parsed: Any = msgspec.json.decode(value)
        except (msgspec.DecodeError, RecursionError):
            try:  # plain text: sent as a string, which the server refuses for want of an id
                return json.dumps(value.decode("utf-8")).encode(), target, None, None
            except UnicodeDecodeError as exc:
                return b"", target, None, f"the line is not valid UTF-8 ({exc.reason})"
        if not isinstance(parsed, dict):
            return value, target, None, None
        collection = parsed.get("collection") or self.settings.ingest.collection
        try:
            check_collection_name(collection)
        except InvalidStoreRequest as exc:
            return b"", target, None, exc.message
        model = parsed.get("model")
        doc_id = parsed.get("id")
        target = (collection, model if isinstance(model, str) else None)
        return value, target, doc_id if isinstance(doc_id, str) else None, None

    async def _send(self, batch: Batch, progress: Progress) -> None:
        response = await self._post(f"/v1/collections/{batch.collection}/documents", batch)
        if response.status_code in (413, 422):
            if len(batch.records) > 1:
                for half in batch.halves():
                    await self._send(half, progress)
                return
            self.dead.write([(batch.records[0], _message(response))])
            progress.add(done=1, failed=1)
            return
        if response.status_code != 200:
            raise ServerRefused(
                f"{self.server} answered {response.status_code} for {len(batch.records)} "
                f"documents of {batch.collection!r}: {_message(response)}"
            )
        results = response.json()["results"]
        refused = [
            (batch.records[r["index"]], r["error"]["message"])
            for r in results
            if r["status"] == "failed"
        ]
        if refused:
            self.dead.write(refused)
        progress.add(done=len(results), stored=len(results) - len(refused), failed=len(refused))

    async def _post(self, url: str, batch: Batch) -> httpx.Response:
        """The answer to one batch, after waiting out overload (429, 503: Retry-After) and
        a server that went away (with backoff, up to UNREACHABLE_DEADLINE_S)."""
        body = batch.body()
        unreachable_since: float | None = None
        delay = 0.5
        give_up = time.monotonic() + OVERLOADED_DEADLINE_S
        while True:
            try:
                response = await self.http.post(url, content=body)
            except httpx.TransportError as exc:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > UNREACHABLE_DEADLINE_S:
                    raise ServerRefused(f"{self.server} unreachable: {exc!r}") from exc
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 10.0)
                continue
            unreachable_since = None
            if response.status_code not in (429, 503) or time.monotonic() > give_up:
                return response  # past the deadline, the refusal ends the run
            await asyncio.sleep(_retry_after(response))


def _retry_after(response: httpx.Response) -> float:
    with contextlib.suppress(ValueError):
        return min(max(float(response.headers.get("retry-after", "1")), 0.1), MAX_RETRY_AFTER_S)
    return 1.0


def _message(response: httpx.Response) -> str:
    """The message of an answer in the server's error shape, or its text."""
    with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
        error = response.json()["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    return response.text[:500] or f"HTTP {response.status_code}"


async def send(settings: Settings, path: Path, server: str) -> None:
    """Send ``path``'s documents to ``server``'s documents route; print the totals."""
    dead = DeadLetterFile(path)
    progress = Progress(
        f"{path.name} -> {server} {settings.ingest.collection}",
        count_records(path),
        interval_s=settings.progress_interval_s,
    )
    async with progress:
        await DocumentsClient(settings, server, dead).send_file(path, progress)
    print(f"{progress.summary()}{dead}")
