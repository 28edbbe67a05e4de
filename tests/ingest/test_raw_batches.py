"""The raw reader of record batches: the same records as aiokafka's reader where that
one works, and the records around an undecodable header key where it does not."""

from __future__ import annotations

import struct

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, _DefaultRecordBatchBuilderPy

from ingest.raw_batches import RawEntry, split_batches


class RawName(str):
    """A header key that encodes to bytes that are not UTF-8, as a Go producer may write."""

    def encode(self, *args: object, **kwargs: object) -> bytes:
        return b"\xff\xfe-key"


def batch(
    base_offset: int, records: list[tuple[bytes | None, bytes | None, list]], codec: int = 0
) -> bytes:
    builder = _DefaultRecordBatchBuilderPy(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for delta, (key, value, headers) in enumerate(records):
        builder.append(delta, timestamp=None, key=key, value=value, headers=headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)  # the broker assigns the base offset
    return bytes(data)


@pytest.mark.parametrize("codec", [0, 1])  # none, gzip
def test_the_same_records_as_the_client_reads(codec: int) -> None:
    records = [
        (b"a", b"first", [("h", b"1"), ("empty", None)]),
        (None, b"no key " * 100, []),
        (b"tomb", None, [("flotilla-collection", b"laws")]),
    ]
    data = batch(40, records, codec) + batch(43, [(b"z", b"last", [])], codec)
    batches = list(split_batches(data + b"\x00" * 30))  # a truncated tail is left alone
    assert [(b.base_offset, b.next_offset) for b in batches] == [(40, 43), (43, 44)]
    for raw in batches:
        assert raw.client_can_read()
        client = [
            RawEntry(r.offset, r.key, r.value, tuple((k.encode(), v) for k, v in r.headers))
            for r in DefaultRecordBatch(bytearray(raw.data))
        ]
        assert raw.entries() == client


def test_a_header_key_that_is_not_utf8_leaves_its_neighbours_readable() -> None:
    records = [
        (b"good-1", b"one", []),
        (b"bad", b"two", [(RawName("x"), b"v")]),
        (b"good-2", b"three", [("ok", b"1")]),
    ]
    (raw,) = split_batches(batch(7, records))
    assert not raw.client_can_read()
    with pytest.raises(Exception, match=r"(?i)utf-8|unicode"):
        list(DefaultRecordBatch(bytearray(raw.data)))
    assert raw.entries() == [
        RawEntry(7, b"good-1", b"one", ()),
        RawEntry(8, b"bad", b"two", ((b"\xff\xfe-key", b"v"),)),
        RawEntry(9, b"good-2", b"three", ((b"ok", b"1"),)),
    ]
