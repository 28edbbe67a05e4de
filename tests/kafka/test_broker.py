"""The real broker with the client the pipeline uses (aiokafka): topics made by the admin
client, an idempotent producer, a consumer group with manual commits that resumes after
its committed offsets, end offsets; and the broker's own start/stop lifecycle."""

from __future__ import annotations

import asyncio
import socket
from collections import defaultdict

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.services.kafka.broker import HOST, KafkaBroker
from tests.kafka.fixtures import unique_name

pytestmark = pytest.mark.slow

PARTITIONS = 4
KEYS = 24
PER_KEY = 10


async def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    # aiokafka returns the per-topic error codes instead of raising them.
    assert [(topic, code) for topic, code, _ in response.topic_errors] == [(name, 0)]


async def drain(
    consumer: AIOKafkaConsumer, count: int, timeout_s: float = 15.0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Exactly `count` records, then a short poll proving nothing else is pending."""
    records: list[ConsumerRecord[bytes, bytes]] = []
    async with asyncio.timeout(timeout_s):
        while len(records) < count:
            batches = await consumer.getmany(timeout_ms=500)
            records.extend(record for batch in batches.values() for record in batch)
    extra = await consumer.getmany(timeout_ms=300)
    assert not any(extra.values()), "more records than produced"
    return records


def group_consumer(bootstrap: str, topic: str, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )


async def test_group_resumes_after_committed_offsets(kafka_broker: KafkaBroker) -> None:
    bootstrap = kafka_broker.bootstrap
    topic, group = unique_name("smoke"), unique_name("smoke-group")
    await create_topic(bootstrap, topic, PARTITIONS)
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        sends = [
            await producer.send(topic, f"{key}:{seq}".encode(), key=f"doc-{key}".encode())
            for seq in range(PER_KEY)
            for key in range(KEYS)
        ]
        written = await asyncio.gather(*sends)
    finally:
        await producer.stop()
    per_partition: dict[int, int] = defaultdict(int)
    for metadata in written:
        per_partition[metadata.partition] += 1
    assert len(per_partition) > 1, "keys should spread over partitions"

    consumer = group_consumer(bootstrap, topic, group)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(partitions)
        assert ends == {tp: per_partition[tp.partition] for tp in partitions}
        first = await drain(consumer, KEYS * PER_KEY)
        # A key keeps its partition, and its records keep the order they were sent in.
        by_key: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
        for record in first:
            assert record.key is not None and record.value is not None
            seq = int(record.value.split(b":")[1])
            by_key[record.key].append((record.partition, seq))
        for placed in by_key.values():
            assert len({partition for partition, _ in placed}) == 1
            assert [seq for _, seq in placed] == list(range(PER_KEY))
        # Commit half of each partition, as a pipeline does for what its sink confirmed.
        committed = {tp: ends[tp] // 2 for tp in partitions}
        await consumer.commit(committed)
        for tp in partitions:
            assert await consumer.committed(tp) == committed[tp]
    finally:
        await consumer.stop()

    resumed = group_consumer(bootstrap, topic, group)
    await resumed.start()
    try:
        rest = await drain(resumed, sum(ends[tp] - committed[tp] for tp in partitions))
    finally:
        await resumed.stop()
    assert sorted((r.partition, r.offset) for r in rest) == [
        (tp.partition, offset) for tp in partitions for offset in range(committed[tp], ends[tp])
    ]


def test_lifecycle_is_idempotent_and_cleans_up() -> None:
    broker = KafkaBroker(heap_mb=256)
    broker.stop()  # never started: nothing to do
    with broker:
        assert broker.start() is broker
        port = int(broker.bootstrap.rsplit(":", 1)[1])
        log_path = broker.log_path
        assert log_path is not None and log_path.is_file()
        with socket.create_connection((HOST, port), timeout=2):
            pass
    assert not broker.running
    assert not log_path.parent.parent.exists(), "the temp dir is removed"
    with pytest.raises(OSError), socket.create_connection((HOST, port), timeout=2):
        pass
    broker.stop()
    with pytest.raises(RuntimeError):
        _ = broker.bootstrap
