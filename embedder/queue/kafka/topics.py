"""Kafka topics flotilla creates for itself, and the client settings both halves of the
work queue share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from embedder.errors import NotReady

# Latency over round trips: a fetch waits at most this long on the broker before the
# client may send the next one (which also picks up newly fetchable partitions).
FETCH_MAX_WAIT_MS = 5
# Requests and replies are worthless after their deadline; an hour leaves room to look.
RETENTION_MS = 3_600_000
DEFAULT_MAX_REQUEST_BYTES = 1_048_576  # aiokafka's own, for records that are always small


@dataclass(frozen=True, slots=True)
class TopicSpec:
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)


def short_lived(max_message_bytes: int, retention_ms: int = RETENTION_MS) -> dict[str, str]:
    return {
        "max.message.bytes": str(max_message_bytes),
        "retention.ms": str(retention_ms),
        # Retention only removes closed segments; roll them as often as they expire.
        "segment.ms": str(retention_ms),
    }


def producer(
    bootstrap: str, max_message_bytes: int = DEFAULT_MAX_REQUEST_BYTES
) -> AIOKafkaProducer:
    """A producer that sends each record at once, acknowledged by the leader alone.

    acks=1 and no idempotence: a request lost in a leader failover ends in a 504 the
    client retries, and a duplicate only costs a forward pass (the reply is deduped),
    both cheaper than waiting for replicas on every record. Make it inside the running
    loop: aiokafka binds a client to the loop it is made in.
    """
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=0, max_request_size=max_message_bytes
    )


async def ensure_topics(bootstrap: str, topics: Mapping[str, TopicSpec]) -> None:
    """Create the topics that do not exist yet (replicated up to 3 times); existing
    ones are left as they are, whoever made them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
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
        # another gateway or worker creating it at the same time).
        failed = [
            (name, code, msg) for name, code, msg in response.topic_errors if code not in (0, 36)
        ]
        if failed:
            raise NotReady(f"could not create Kafka topics: {failed}")
    finally:
        await admin.close()
