"""The record contract: every record is an upsert, a delete, or a poison with a reason."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from ingest.records import (
    COLLECTION_HEADER,
    MAX_METADATA_DEPTH,
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


def poison(op: Upsert | Delete | Poison) -> Poison:
    assert isinstance(op, Poison), op
    return op


def nested(depth: int) -> bytes:
    return b'{"text": "t", "metadata": {"a": ' + b"[" * depth + b"]" * depth + b"}}"


def test_deep_nesting_is_poison_at_any_depth() -> None:
    # About 2 KB of brackets made msgspec raise RecursionError out of the loop.
    for depth in (25, 500, 1_000, 5_000, 100_000):
        found = poison(parse(b"d", nested(depth)))
        assert found.code == "too_deep", (depth, found)
    assert isinstance(parse(b"d", nested(MAX_METADATA_DEPTH - 1)), Upsert)  # + the dict


def test_headers_without_values_or_utf8_are_poison_not_errors() -> None:
    for headers, what in [
        ([(COLLECTION_HEADER, None)], "has no value"),
        ([(MODEL_HEADER, b"\xff")], "not valid UTF-8"),
        ([(COLLECTION_HEADER, b"")], "is empty"),
        ([("caf\udce9", b"x")], "header key is not valid UTF-8"),  # read raw, undecodable
    ]:
        found = poison(parse(b"d", b"text", headers))  # type: ignore[arg-type]
        assert what in found.reason and found.code == "bad_header", found
    # Unknown headers, and headers without values that flotilla does not read, are fine.
    assert isinstance(parse(b"d", b"text", [("trace", None), ("x", b"\xff")]), Upsert)  # type: ignore[list-item]


def test_collection_names_the_store_would_refuse_are_poison() -> None:
    for name in ("../etc", "has space", "x" * 300, "-lead"):
        value = json.dumps({"text": "t", "collection": name}).encode()
        assert poison(parse(b"d", value)).code == "bad_collection", name
        assert poison(parse(b"d", None, [(COLLECTION_HEADER, name.encode())])).code == (
            "bad_collection"
        )


def test_wrong_types_and_odd_json_are_poison() -> None:
    for value in [
        b'{"text": "t", "metadata": [1]}',
        b'{"text": "t", "id": 5}',
        b'{"text": "t", "metadata": {"a": 1e999}}',
        b'{"text": "\\ud800"}',  # a lone surrogate escape
        b'{"text": "t"} trailing',
        b"{}",
    ]:
        assert poison(parse(b"d", value)).code == "bad_json", value


def test_a_resolver_that_raises_is_a_poison() -> None:
    def broken(name: str) -> str | None:
        raise RuntimeError("catalog unreadable")

    rules = RecordRules("main", "mini", 100, broken)
    found = poison(parse_record(b"d", b"text", [], SRC, rules))
    assert "catalog unreadable" in found.reason


@given(st.binary(max_size=300), st.one_of(st.none(), st.binary(max_size=20)))
def test_parsing_never_raises(value: bytes, key: bytes | None) -> None:
    assert isinstance(parse(key, value), Upsert | Delete | Poison)
    assert isinstance(parse(key, b'{"text": "t", "metadata": ' + value + b"}"), Upsert | Poison)
