"""The dead-letter topic ``<topic>.dlq``: each record the pipeline cannot process goes
there as it came (key, value, headers) plus why and where from, so nothing is lost and
whoever fixes the cause can replay it. Reading them: the reason is the
``flotilla-error`` header, the origin ``flotilla-source-topic/-partition/-offset``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer

from ingest.pipeline import RawRecord

ERROR_HEADER = "flotilla-error"
TRUNCATED_HEADER = "flotilla-value-truncated"  # the value's original size, when cut
# A dead letter is the record plus a few headers; one this large would not fit under the
# broker's default max.message.bytes (1 MiB), so its value is cut to TRUNCATED_VALUE_BYTES
# (the headers say so) rather than failing the chunk and blocking the partition.
MAX_DEAD_LETTER_BYTES = 1_000_000
TRUNCATED_VALUE_BYTES = 64 * 1024
MAX_REASON_CHARS = 2000


def dlq_topic(topic: str) -> str:
    return f"{topic}.dlq"


async def send_dead_letters(
    producer: AIOKafkaProducer, poisons: Sequence[tuple[RawRecord, str]]
) -> None:
    """Send each poison record, original bytes and headers plus the reason and its
    source, to ``<topic>.dlq``; returns once the broker acknowledged them all."""
    sends = []
    for record, reason in poisons:
        value = record.value
        headers = [(_header_name(name), data) for name, data in record.headers]
        if _size(record) > MAX_DEAD_LETTER_BYTES and value is not None:
            headers.append((TRUNCATED_HEADER, str(len(value)).encode()))
            value = value[:TRUNCATED_VALUE_BYTES]
        if value is None and record.key is None:
            value = b""  # a keyless tombstone: aiokafka sends nothing without either
        headers += [
            (ERROR_HEADER, reason[:MAX_REASON_CHARS].encode("utf-8", "replace")),
            ("flotilla-source-topic", record.source.topic.encode()),
            ("flotilla-source-partition", str(record.source.partition).encode()),
            ("flotilla-source-offset", str(record.source.offset).encode()),
        ]
        sends.append(
            await producer.send(
                dlq_topic(record.source.topic), value=value, key=record.key, headers=headers
            )
        )
    await asyncio.gather(*sends)


def _header_name(name: str) -> str:
    """A header key as the producer can write it: one read raw that was not UTF-8 keeps
    its readable part (the reason says which record it was)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _size(record: RawRecord) -> int:
    size = len(record.key or b"") + len(record.value or b"")
    return size + sum(len(name) + len(data or b"") for name, data in record.headers)
