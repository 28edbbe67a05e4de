"""Kafka topics flotilla creates for itself (the dead-letter topic of ingest), idempotently."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aiokafka.admin import NewTopic

from embedder.core.errors import NotReady
from ingest.kafka_clients import KafkaClients


@dataclass(frozen=True, slots=True)
class TopicSpec:
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)


async def ensure_topics(kafka: KafkaClients, topics: Mapping[str, TopicSpec]) -> None:
    """Create the topics that do not exist yet (replicated up to 3 times); existing
    ones are left as they are, whoever made them."""
    admin = kafka.admin()
    await kafka.start(admin.start())
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in topics if name not in existing]
        if not missing:
            return
        brokers = len((await admin.describe_cluster())["brokers"])
        replicas = max(1, min(3, brokers))
        response = await admin.create_topics(
            [
                NewTopic(
                    name, topics[name].partitions, replicas, topic_configs=topics[name].configs
                )
                for name in missing
            ]
        )
        # aiokafka returns per-topic error codes; 36 is TOPIC_ALREADY_EXISTS (a race with
        # another ingest worker creating it at the same time).
        failed = [
            (name, code, msg) for name, code, msg in response.topic_errors if code not in (0, 36)
        ]
        if failed:
            raise NotReady(f"could not create Kafka topics: {failed}")
    finally:
        await admin.close()
