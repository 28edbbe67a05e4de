"""The record contract: what a Kafka record means to the pipeline.

- key: the document id (UTF-8).
- value: JSON ``{"id", "text", "metadata"?, "collection"?, "model"?}``, or plain UTF-8
  text (the key is then the id). A null value (tombstone) deletes the document.
- headers ``flotilla-collection`` and ``flotilla-model`` override the value's fields.

Anything else becomes a ``Poison`` with a reason, bound for the dead-letter topic:
a bad record never blocks its partition and is never silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

COLLECTION_HEADER = "flotilla-collection"
MODEL_HEADER = "flotilla-model"


@dataclass(frozen=True, slots=True)
class SourceRef:
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Upsert:
    doc_id: str
    text: str
    collection: str
    model: str
    source: SourceRef
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Delete:
    doc_id: str
    collection: str
    source: SourceRef


@dataclass(frozen=True, slots=True)
class Poison:
    reason: str
    source: SourceRef


Operation = Upsert | Delete


@dataclass(frozen=True, slots=True)
class RecordRules:
    default_collection: str
    default_model: str
    max_text_bytes: int
    resolve_model: Callable[[str], str | None]  # name or alias -> canonical name, None if unknown


class _Body(msgspec.Struct, forbid_unknown_fields=False):
    text: str
    id: str | None = None
    metadata: dict[str, Any] = {}
    collection: str | None = None
    model: str | None = None


def _header(headers: Sequence[tuple[str, bytes]], name: str) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("utf-8", errors="replace")
    return None


def parse_record(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]],
    source: SourceRef,
    rules: RecordRules,
) -> Upsert | Delete | Poison:
    try:
        doc_key = key.decode("utf-8") if key is not None else None
    except UnicodeDecodeError:
        return Poison("the record key is not valid UTF-8", source)
    collection = _header(headers, COLLECTION_HEADER)

    if value is None:  # tombstone
        if not doc_key:
            return Poison("a tombstone needs a key naming the document to delete", source)
        return Delete(doc_key, collection or rules.default_collection, source)

    try:
        text_value = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Poison(f"the value is not valid UTF-8 ({exc.reason} at byte {exc.start})", source)

    body: _Body | None = None
    if text_value.lstrip().startswith("{"):
        try:
            body = msgspec.json.decode(value, type=_Body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return Poison(f"the value is not a valid document JSON object: {exc}", source)
    text = body.text if body is not None else text_value
    doc_id = doc_key
    if body is not None and body.id is not None:
        if doc_key is not None and body.id != doc_key:
            return Poison(f"the key {doc_key!r} and the value's id {body.id!r} differ", source)
        doc_id = body.id
    if not doc_id:
        return Poison("no document id: set the record key or the value's 'id'", source)
    if not text.strip():
        return Poison("the document text is empty", source)
    size = len(text.encode("utf-8"))
    if size > rules.max_text_bytes:
        return Poison(
            f"the text is {size} bytes, over the limit of {rules.max_text_bytes}: split the "
            "document, or raise --ingest-max-text-bytes",
            source,
        )

    asked_model = (
        _header(headers, MODEL_HEADER)
        or (body.model if body is not None else None)
        or rules.default_model
    )
    model = rules.resolve_model(asked_model)
    if model is None:
        return Poison(f"unknown model {asked_model!r}", source)
    return Upsert(
        doc_id=doc_id,
        text=text,
        collection=collection or (body.collection if body else None) or rules.default_collection,
        model=model,
        source=source,
        metadata=dict(body.metadata) if body is not None else {},
    )


def last_writes(operations: Sequence[Operation]) -> tuple[list[Upsert], list[Delete]]:
    """Collapse a run of operations to the last one per (collection, document): applying
    the result in any order equals applying the run in order, so a delete after an
    upsert of the same key wins, and an upsert after a delete brings it back."""
    last: dict[tuple[str, str], Operation] = {}
    for op in operations:
        key = (op.collection, op.doc_id)
        last.pop(key, None)  # keep insertion order = order of the last write
        last[key] = op
    upserts = [op for op in last.values() if isinstance(op, Upsert)]
    deletes = [op for op in last.values() if isinstance(op, Delete)]
    return upserts, deletes
