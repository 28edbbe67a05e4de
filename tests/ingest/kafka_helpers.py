"""Helpers for the ingest tests against the real broker: topics, producing, draining."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic


async def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


async def produce(
    bootstrap: str, topic: str, records: Sequence[tuple[bytes | None, bytes | None]], **kw: object
) -> None:
    """Keyed records through an idempotent producer; returns once all are acknowledged."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=5
    )
    await producer.start()
    try:
        sends = [await producer.send(topic, key=k, value=v, **kw) for k, v in records]  # type: ignore[arg-type]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def read_all(
    bootstrap: str, topic: str, expected: int, timeout_s: float = 30
) -> list[object]:
    """Every record of a topic, from the start, once ``expected`` have arrived."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    got: list[object] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(got) < expected and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(messages)
    finally:
        await consumer.stop()
    return got


async def committed_lag(bootstrap: str, topic: str, group: str, partitions: int) -> int:
    """Records of the topic's ``partitions`` not yet committed by the group."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(parts)
        lag = 0
        for tp in parts:
            done = await consumer.committed(tp)
            lag += ends[tp] - (done or 0)
        return lag
    finally:
        await consumer.stop()


async def topic_size(bootstrap: str, topic: str) -> int:
    """Records ever written to the topic (the sum of its partitions' end offsets)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    partitions = [TopicPartition(topic, p["partition"]) for p in described["partitions"]]
    assert partitions, f"no topic {topic}"
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        return sum((await consumer.end_offsets(partitions)).values())
    finally:
        await consumer.stop()


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.5)
