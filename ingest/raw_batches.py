"""Reading a partition's records when the Kafka client cannot.

aiokafka decodes every header key as UTF-8 while it iterates a record batch, and a
key that is not (producers in Go or C can write any bytes) raises out of ``getmany``
for the whole batch, every time it is fetched: the partition would be stuck. This
module fetches that partition's bytes itself and reads the v2 record batches without
decoding anything, so the source can dead-letter the unreadable record and store the
good ones beside it. It is the slow path, used only after the client failed.

The format is Kafka's ``DefaultRecordBatch`` (magic 2, the only one Kafka 4 writes):
a 61-byte big-endian header, then the records, compressed as the attributes say.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.codec import gzip_decode, lz4_decode, snappy_decode, zstd_decode
from aiokafka.errors import for_code
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.default_records import DefaultRecordBatch

from ingest.kafka_clients import KafkaClients
from ingest.pipeline import RawRecord
from ingest.records import SourceRef

# baseOffset, batchLength, leaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
_LOG_OVERHEAD = 12  # baseOffset and batchLength precede the length they count
_CONTROL = 0x20
_CODECS = {1: gzip_decode, 2: snappy_decode, 3: lz4_decode, 4: zstd_decode}
READ_UNCOMMITTED = 0


@dataclass(frozen=True, slots=True)
class RawEntry:
    """One record as stored: nothing decoded (header keys stay bytes)."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[bytes, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class RawBatch:
    base_offset: int
    next_offset: int
    control: bool
    data: bytes  # the whole batch, header included

    def client_can_read(self) -> bool:
        """Whether aiokafka's own reader gets through this batch."""
        try:
            for _ in DefaultRecordBatch(bytearray(self.data)):
                pass
        except Exception:
            return False
        return True

    def entries(self) -> list[RawEntry]:
        """The batch's records; raises ``ValueError`` if the bytes are not a v2 batch."""
        header = _HEADER.unpack_from(self.data)
        magic, attributes, count = header[3], header[5], header[12]
        if magic != 2:
            raise ValueError(f"record batch format v{magic} is not read here")
        body = memoryview(self.data)[_HEADER.size :]
        codec = attributes & 0x07
        if codec:
            body = memoryview(_CODECS[codec](body.tobytes()))
        reader = _Reader(body)
        return [reader.record(self.base_offset) for _ in range(count)]


def split_batches(data: bytes) -> Iterator[RawBatch]:
    """The complete batches in a fetch response's record set (a truncated last one is
    left for the next fetch, as the client does)."""
    pos = 0
    while pos + _HEADER.size <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        end = pos + _LOG_OVERHEAD + length
        if end > len(data):
            return
        header = _HEADER.unpack_from(data, pos)
        yield RawBatch(
            base_offset=base_offset,
            next_offset=base_offset + header[6] + 1,
            control=bool(header[5] & _CONTROL),
            data=bytes(data[pos:end]),
        )
        pos = end


class _Reader:
    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.pos = 0

    def varint(self) -> int:
        """A zigzag-encoded varint, as Kafka writes lengths and deltas."""
        shift = result = 0
        while True:
            byte = self.buffer[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7
            if shift > 63:
                raise ValueError("varint out of range")

    def take(self, length: int) -> bytes | None:
        if length < 0:
            return None
        if self.pos + length > len(self.buffer):
            raise ValueError("record runs past its batch")
        out = self.buffer[self.pos : self.pos + length].tobytes()
        self.pos += length
        return out

    def record(self, base_offset: int) -> RawEntry:
        self.varint()  # length
        self.pos += 1  # attributes
        self.varint()  # timestamp delta
        offset = base_offset + self.varint()
        key = self.take(self.varint())
        value = self.take(self.varint())
        headers = []
        for _ in range(self.varint()):
            name = self.take(self.varint()) or b""
            headers.append((name, self.take(self.varint())))
        return RawEntry(offset, key, value, tuple(headers))


async def fetch_batches(
    kafka: KafkaClients, tp: TopicPartition, offset: int, max_bytes: int = 1_048_576
) -> list[RawBatch]:
    """The batches of ``tp`` from the one holding ``offset``, as the leader returns them
    to one fetch (at least one batch, however large, since Kafka 0.10.1)."""
    client = kafka.client()
    try:
        await kafka.start(client.bootstrap())
        await client.add_topic(tp.topic)
        leader = client.cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            raise for_code(5)(f"no leader for {tp}")  # LEADER_NOT_AVAILABLE, retriable
        request = FetchRequest(
            0, 1, max_bytes, READ_UNCOMMITTED, [(tp.topic, [(tp.partition, offset, max_bytes)])]
        )
        response = await client.send(leader, request)
    finally:
        await client.close()
    for _topic, partitions in response.topics:
        for partition, error_code, _highwater, *data in partitions:
            if partition == tp.partition:
                if error_code:
                    raise for_code(error_code)(f"fetching {tp} at {offset}")
                return list(split_batches(data[-1] or b""))
    return []


async def through_unreadable(
    kafka: KafkaClients, tp: TopicPartition, offset: int, *, windows: int = 8
) -> list[RawBatch] | None:
    """The batches of ``tp`` from ``offset`` through the first one the client cannot
    read, looking ``windows`` fetches ahead; None if there is none there."""
    seen: list[RawBatch] = []
    for _ in range(windows):
        batches = [b for b in await fetch_batches(kafka, tp, offset) if b.next_offset > offset]
        if not batches:
            return None
        for batch in batches:
            seen.append(batch)
            if not batch.control and not batch.client_can_read():
                return seen
        offset = batches[-1].next_offset
    return None


def raw_records(tp: TopicPartition, batches: Sequence[RawBatch], position: int) -> list[RawRecord]:
    """The records of ``batches`` from offset ``position`` on, as the pipeline takes them."""
    return [
        RawRecord(
            key=entry.key,
            value=entry.value,
            # surrogateescape keeps undecodable bytes visible to the record contract,
            # which dead-letters the record for them.
            headers=tuple(
                (name.decode("utf-8", "surrogateescape"), data) for name, data in entry.headers
            ),
            source=SourceRef(tp.topic, tp.partition, entry.offset),
        )
        for batch in batches
        if not batch.control
        for entry in batch.entries()
        if entry.offset >= position
    ]
