"""The record contract: what a Kafka record means to the pipeline.

- key: the document id (UTF-8).
- value: JSON ``{"id", "text", "metadata"?, "collection"?, "model"?}``, or plain UTF-8
  text (the key is then the id). A null value (tombstone) deletes the document.
- instead of ``text``, the value may carry a page image or a PDF to read with OCR, in
  the ``/v1/ocr`` request's vocabulary (``embedder.tasks.ocr.api``), and ``pages``? (0-based)::

      {"id": "scan-7", "document": {"type": "image_url", "image_url": "data:image/png;base64,..."}}
      {"id": "scan-8", "document": {"type": "document_url",
                                    "document_url": "data:application/pdf;base64,..."}}
      {"id": "scan-9", "document": {"type": "document_url", "document_url": "/srv/scans/9.pdf"}}

  A path (or ``file://`` URL) is read only under the OCR local roots (--ocr-local-roots)
  of the worker that runs the OCR model; nothing is fetched from http(s). The record
  becomes an ``Upsert`` whose ``document`` is the OCR job's body; the pipeline reads it
  (``ingest.reading``) and stores its pages' passages. A value with both ``text`` and
  ``document``, or neither, is poison.
- headers ``flotilla-collection`` and ``flotilla-model`` override the value's fields.

Anything else becomes a ``Poison`` with a reason and a stable ``code`` (the metrics'
label), bound for the dead-letter topic: a bad record never blocks its partition and
is never silently dropped. ``parse_record`` is total: whatever the bytes (nesting a
thousand levels deep, invalid UTF-8 anywhere, headers without values), it returns,
never raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from embedder.core.errors import FlotillaError
from embedder.tasks.ocr import api as ocr_api
from ingest.store.contract import check_collection_name

COLLECTION_HEADER = "flotilla-collection"
MODEL_HEADER = "flotilla-model"
# Metadata nested deeper than this is refused: stores and JSON encoders recurse per level
# (qdrant-client fails near 500). Elasticsearch's default mapping depth limit is 20 too.
MAX_METADATA_DEPTH = 20


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
    # A record carrying an image or PDF: the /v1/ocr request body that reads it (``text``
    # is then empty until the pipeline has read the pages).
    document: bytes | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    doc_id: str
    collection: str
    source: SourceRef


@dataclass(frozen=True, slots=True)
class Poison:
    reason: str
    source: SourceRef
    # One of a few stable words (not_utf8, bad_json, too_deep, ...): a metrics label and
    # what to group dead letters by; ``reason`` says the details.
    code: str = "invalid_record"


Operation = Upsert | Delete


@dataclass(frozen=True, slots=True)
class RecordRules:
    default_collection: str
    default_model: str
    max_text_bytes: int
    resolve_model: Callable[[str], str | None]  # name or alias -> canonical name, None if unknown
    ocr_model: str | None = None  # reads records that carry a document; None: none served


class _Body(msgspec.Struct, forbid_unknown_fields=False):
    # UNSET, not None: a null or non-string text is refused as before ("Expected `str`").
    text: str | msgspec.UnsetType = msgspec.UNSET
    # Kept as its JSON: it becomes the OCR job's body as sent, base64 never re-encoded.
    document: msgspec.Raw = msgspec.Raw(b"")
    pages: list[int] | None = None
    id: str | None = None
    metadata: dict[str, Any] = {}
    collection: str | None = None
    model: str | None = None


class _Refused(Exception):
    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _header(headers: Sequence[tuple[str, bytes | None]], name: str) -> str | None:
    for key, value in headers:
        if key == name:
            if value is None:
                raise _Refused("bad_header", f"the {name} header has no value")
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                raise _Refused("bad_header", f"the {name} header is not valid UTF-8") from None
            if not text:
                raise _Refused("bad_header", f"the {name} header is empty")
            return text
    return None


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8
        return False
    return True


def _collection(name: str) -> str:
    try:
        return check_collection_name(name)
    except FlotillaError as exc:
        raise _Refused("bad_collection", exc.message) from None


def _depth(value: object) -> int:
    """How many containers deep ``value`` nests, walked without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > MAX_METADATA_DEPTH:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def parse_record(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    source: SourceRef,
    rules: RecordRules,
) -> Upsert | Delete | Poison:
    """The operation a record asks for, or why it cannot be processed. Never raises."""
    try:
        return _parse(key, value, headers, source, rules)
    except _Refused as refused:
        return Poison(refused.reason, source, refused.code)
    except RecursionError:  # msgspec refuses JSON nested about a thousand levels deep
        return Poison(
            f"the value nests too deeply to read (metadata may nest {MAX_METADATA_DEPTH} levels)",
            source,
            "too_deep",
        )
    except Exception as exc:  # a case no rule above foresaw: still this record's fault
        return Poison(f"the record could not be read: {type(exc).__name__}: {exc}", source)


def _parse(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    source: SourceRef,
    rules: RecordRules,
) -> Upsert | Delete | Poison:
    try:
        doc_key = key.decode("utf-8") if key is not None else None
    except UnicodeDecodeError:
        return Poison("the record key is not valid UTF-8", source, "not_utf8")
    for name, _ in headers:
        if not name.isascii() and not _encodable(name):
            # Only a batch read raw has such a key (the client cannot decode it).
            return Poison("a header key is not valid UTF-8", source, "bad_header")
    collection = _header(headers, COLLECTION_HEADER)

    if value is None:  # tombstone
        if not doc_key:
            return Poison("a tombstone needs a key naming the document to delete", source, "no_id")
        return Delete(doc_key, _collection(collection or rules.default_collection), source)

    try:
        text_value = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Poison(
            f"the value is not valid UTF-8 ({exc.reason} at byte {exc.start})", source, "not_utf8"
        )

    body: _Body | None = None
    if text_value.lstrip().startswith("{"):
        try:
            body = msgspec.json.decode(value, type=_Body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return Poison(
                f"the value is not a valid document JSON object: {exc}", source, "bad_json"
            )
        if _depth(body.metadata) > MAX_METADATA_DEPTH:
            return Poison(
                f"the metadata nests deeper than {MAX_METADATA_DEPTH} levels", source, "too_deep"
            )
    document = _document(body, rules) if body is not None else None
    if body is not None and document is None and body.text is msgspec.UNSET:
        return Poison(
            "the value has neither 'text' nor 'document': send the text, or an image or PDF "
            'as {"document": {"type": "image_url" | "document_url", ...}}',
            source,
            "bad_json",
        )
    text = text_value if body is None else body.text or ""  # a document's text is its pages'
    doc_id = doc_key
    if body is not None and body.id is not None:
        if doc_key is not None and body.id != doc_key:
            return Poison(
                f"the key {doc_key!r} and the value's id {body.id!r} differ", source, "bad_id"
            )
        doc_id = body.id
    if not doc_id:
        return Poison("no document id: set the record key or the value's 'id'", source, "no_id")
    if document is None and not text.strip():
        return Poison("the document text is empty", source, "empty_text")
    size = len(text.encode("utf-8"))
    if size > rules.max_text_bytes:
        return Poison(
            f"the text is {size} bytes, over the limit of {rules.max_text_bytes}: split the "
            "document, or raise --ingest-max-text-bytes",
            source,
            "too_large",
        )

    asked_model = (
        _header(headers, MODEL_HEADER)
        or (body.model if body is not None else None)
        or rules.default_model
    )
    try:
        model = rules.resolve_model(asked_model)
    except FlotillaError as exc:  # an adapter folder that cannot serve, say
        return Poison(f"model {asked_model!r}: {exc.message}", source, "unknown_model")
    if model is None:
        return Poison(f"unknown model {asked_model!r}", source, "unknown_model")
    return Upsert(
        doc_id=doc_id,
        text=text,
        collection=_collection(
            collection or (body.collection if body else None) or rules.default_collection
        ),
        model=model,
        source=source,
        metadata=dict(body.metadata) if body is not None else {},
        document=document,
    )


def _document(body: _Body, rules: RecordRules) -> bytes | None:
    """The OCR job's body for a value that carries a document, checked as the OCR model
    will read it (its type, a URL present, pages not negative); None without one."""
    raw = bytes(body.document)
    if raw in (b"", b"null"):
        if body.pages is not None:
            raise _Refused("bad_document", "'pages' is given without a 'document' to read")
        return None
    if body.text is not msgspec.UNSET:
        raise _Refused(
            "bad_document",
            "the value has both 'text' and 'document': send one (the text, or the image or "
            "PDF to read it from)",
        )
    if rules.ocr_model is None:
        raise _Refused(
            "no_ocr_model",
            "the record carries a document to read, and no OCR model is served here: add "
            "one to the fleet (ppocrv5-mobile), or send the text",
        )
    fields: dict[str, Any] = {"model": rules.ocr_model, "document": orjson.Fragment(raw)}
    if body.pages is not None:
        fields["pages"] = body.pages
    request = orjson.dumps(fields)
    try:
        ocr_api.decode(request)
    except FlotillaError as exc:
        raise _Refused("bad_document", f"the document cannot be read: {exc.message}") from None
    return request


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
