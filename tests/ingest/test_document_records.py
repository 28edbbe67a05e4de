"""The record contract's document form: a record may carry an image or a PDF (base64, or a
path under the OCR local roots) instead of text, in the /v1/ocr request's vocabulary."""

from __future__ import annotations

import json

import pytest

from ingest.records import Poison, RecordRules, SourceRef, Upsert, parse_record

SRC = SourceRef("scans", 0, 3)
RULES = RecordRules(
    default_collection="main",
    default_model="mini",
    max_text_bytes=100,
    resolve_model=lambda name: name if name == "mini" else None,
    ocr_model="ppocrv5-mobile",
)
PNG = {"type": "image_url", "image_url": "data:image/png;base64,iVBORw0KGgo="}
PDF = {"type": "document_url", "document_url": "data:application/pdf;base64,JVBERi0="}


def parse(value: object, key: bytes | None = b"scan-1", rules: RecordRules = RULES) -> object:
    return parse_record(key, json.dumps(value).encode(), [], SRC, rules)


@pytest.mark.parametrize(
    "document",
    [PNG, PDF, {"type": "document_url", "document_url": "/srv/scans/a.pdf"},
     {"type": "image_url", "image_url": {"url": "iVBORw0KGgo="}}],
)  # fmt: skip
def test_a_document_becomes_the_ocr_request_that_reads_it(document: dict[str, object]) -> None:
    op = parse({"document": document, "metadata": {"shelf": 4}})
    assert isinstance(op, Upsert)
    assert (op.doc_id, op.text, op.model, op.metadata) == ("scan-1", "", "mini", {"shelf": 4})
    assert op.document is not None
    assert json.loads(op.document) == {"model": "ppocrv5-mobile", "document": document}


def test_the_pages_asked_for_go_with_it_and_the_base64_is_passed_on_as_sent() -> None:
    value = b'{"id": "s", "pages": [0, 2], "document": {"type":"image_url","image_url":"QUJD"}}'
    op = parse_record(None, value, [], SRC, RULES)
    assert isinstance(op, Upsert) and op.document is not None
    assert b'{"type":"image_url","image_url":"QUJD"}' in op.document  # not re-encoded
    assert json.loads(op.document)["pages"] == [0, 2]


@pytest.mark.parametrize(
    ("value", "code", "words"),
    [
        ({"text": "t", "document": PNG}, "bad_document", "both 'text' and 'document'"),
        ({"metadata": {}}, "bad_json", "neither 'text' nor 'document'"),
        ({"document": {"type": "video_url"}}, "bad_document", "document must be"),
        ({"document": {"type": "image_url"}}, "bad_document", "missing or empty"),
        ({"document": "a string"}, "bad_document", "cannot be read"),
        ({"document": PNG, "pages": [-1]}, "bad_document", "0-based"),
        ({"text": "t", "pages": [1]}, "bad_document", "without a 'document'"),
    ],
)
def test_a_record_with_neither_both_or_a_bad_document_is_poison(
    value: dict[str, object], code: str, words: str
) -> None:
    found = parse(value)
    assert isinstance(found, Poison), found
    assert (found.code, found.source) == (code, SRC)
    assert words in found.reason


def test_without_an_ocr_model_a_document_is_poison_that_says_so() -> None:
    rules = RecordRules("main", "mini", 100, lambda name: name, ocr_model=None)
    found = parse({"document": PNG}, rules=rules)
    assert isinstance(found, Poison) and found.code == "no_ocr_model"
    assert "no OCR model" in found.reason


def test_a_null_document_is_no_document() -> None:
    op = parse({"text": "plain", "document": None})
    assert isinstance(op, Upsert) and op.document is None and op.text == "plain"


def test_the_text_limit_does_not_apply_to_a_document() -> None:
    big = {"type": "image_url", "image_url": "QUJD" * 1000}  # 4,000 characters of base64
    assert isinstance(parse({"document": big}), Upsert)
