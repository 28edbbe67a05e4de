"""The record contract: every record is an upsert, a delete, or a poison with a reason."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from ingest.records import (
    COLLECTION_HEADER,
    MODEL_HEADER,
    Delete,
    Operation,
    Poison,
    RecordRules,
    SourceRef,
    Upsert,
    last_writes,
    parse_record,
)

SRC = SourceRef("docs", 2, 17)
RULES = RecordRules(
    default_collection="main",
    default_model="mini",
    max_text_bytes=100,
    resolve_model=lambda name: {"mini": "mini", "alias-mini": "mini", "big": "big"}.get(name),
)


def parse(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | None = None
) -> Upsert | Delete | Poison:
    return parse_record(key, value, headers or [], SRC, RULES)


def test_json_document() -> None:
    value = json.dumps(
        {"id": "d1", "text": "hallo", "metadata": {"lang": "de"}, "collection": "laws"}
    )
    op = parse(b"d1", value.encode())
    assert op == Upsert("d1", "hallo", "laws", "mini", SRC, {"lang": "de"})


def test_plain_text_takes_the_key_as_id() -> None:
    assert parse(b"k9", "Grüße".encode()) == Upsert("k9", "Grüße", "main", "mini", SRC, {})


def test_json_id_without_key() -> None:
    op = parse(None, b'{"id": "x", "text": "t", "model": "alias-mini"}')
    assert isinstance(op, Upsert) and (op.doc_id, op.model) == ("x", "mini")


def test_headers_override_value_fields() -> None:
    value = b'{"id": "d", "text": "t", "collection": "a", "model": "mini"}'
    op = parse(b"d", value, [(COLLECTION_HEADER, b"b"), (MODEL_HEADER, b"big")])
    assert isinstance(op, Upsert) and (op.collection, op.model) == ("b", "big")


def test_tombstone_deletes() -> None:
    assert parse(b"d1", None) == Delete("d1", "main", SRC)
    assert parse(b"d1", None, [(COLLECTION_HEADER, b"laws")]) == Delete("d1", "laws", SRC)


def reason(op: Upsert | Delete | Poison) -> str:
    assert isinstance(op, Poison), op
    assert op.source == SRC
    return op.reason


def test_poison_reasons() -> None:
    assert "not a valid document JSON" in reason(parse(b"d", b'{"text": "unterminated'))
    assert "not a valid document JSON" in reason(parse(b"d", b'{"text": 5}'))
    assert "not valid UTF-8" in reason(parse(b"d", b"\xff\xfe bad"))
    assert "empty" in reason(parse(b"d", b'{"text": "   "}'))
    assert "empty" in reason(parse(b"d", b""))
    assert "over the limit of 100" in reason(parse(b"d", b"x" * 101))
    assert "unknown model 'nope'" in reason(parse(b"d", b'{"text": "t", "model": "nope"}'))
    assert "no document id" in reason(parse(None, b"plain text without a key"))
    assert "differ" in reason(parse(b"a", b'{"id": "b", "text": "t"}'))
    assert "needs a key" in reason(parse(None, None))
    assert "key is not valid UTF-8" in reason(parse(b"\xff", b"t"))


def test_size_limit_counts_utf8_bytes() -> None:
    assert isinstance(parse(b"d", ("ü" * 50).encode()), Upsert)  # 100 bytes
    assert isinstance(parse(b"d", ("ü" * 51).encode()), Poison)


ops = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["1", "2", "3"]), st.booleans()),
    max_size=12,
)


@given(ops)
def test_last_writes_equals_applying_in_order(script: list[tuple[str, str, bool]]) -> None:
    operations: list[Operation] = []
    for i, (collection, doc, is_delete) in enumerate(script):
        source = SourceRef("t", 0, i)
        if is_delete:
            operations.append(Delete(doc, collection, source))
        else:
            operations.append(Upsert(doc, f"v{i}", collection, "mini", source))
    state: dict[tuple[str, str], str] = {}
    for op in operations:  # the reference: apply one by one
        if isinstance(op, Delete):
            state.pop((op.collection, op.doc_id), None)
        else:
            state[(op.collection, op.doc_id)] = op.text
    upserts, deletes = last_writes(operations)
    collapsed = {(u.collection, u.doc_id): u.text for u in upserts}
    assert collapsed == state
    deleted = {(d.collection, d.doc_id) for d in deletes}
    assert not deleted & set(collapsed)
    touched = {(op.collection, op.doc_id) for op in operations}
    assert deleted == touched - set(state)
