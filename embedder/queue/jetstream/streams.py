"""The streams, consumers and bucket the JetStream work queue uses, and their idempotent
creation (every gateway and worker ensures them at start and after every reconnect,
through ``connection.Connection``); their settings are ``config.JetStreamConfig``."""

from __future__ import annotations

import logging

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from embedder.queue.jetstream.config import JetStreamConfig, Lane

log = logging.getLogger(__name__)

# What the server announces when a consumer gives up on a message (max_deliver reached).
MAX_DELIVERIES_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"


def _storage(config: JetStreamConfig) -> StorageType:
    return StorageType.MEMORY if config.storage == "memory" else StorageType.FILE


async def _ensure_stream(js: JetStreamContext, wanted: StreamConfig) -> None:
    assert wanted.name is not None
    try:
        await js.stream_info(wanted.name)
        return  # left as it is, whoever made it: changing retention is not allowed anyway
    except NotFoundError:
        pass
    try:
        await js.add_stream(wanted)
    except BadRequestError as exc:
        # Another gateway or worker created it at the same moment (with other settings).
        log.info("stream %s exists already: %s", wanted.name, exc)


async def ensure_streams(js: JetStreamContext, config: JetStreamConfig) -> None:
    """The work-queue stream and the dead-letter stream, created when missing."""
    await _ensure_stream(
        js,
        StreamConfig(
            name=config.stream,
            subjects=[f"{config.subject_prefix}.>"],
            # A message is gone once acked (or termed): each job is done by one worker.
            retention=RetentionPolicy.WORK_QUEUE,
            max_bytes=config.max_bytes,
            # Full: refuse new requests (the gateway answers 503), never drop queued ones.
            discard=DiscardPolicy.NEW,
            # A gateway's retried publish of one job id is stored once.
            duplicate_window=min(120.0, config.max_age_s),
            storage=_storage(config),
            num_replicas=config.replicas,
            max_age=config.max_age_s,
            max_msg_size=config.max_message_bytes,
        ),
    )
    await _ensure_stream(
        js,
        StreamConfig(
            name=config.dead_stream,
            subjects=[f"{config.dead_prefix}.>"],
            retention=RetentionPolicy.LIMITS,
            max_bytes=config.max_bytes,
            storage=_storage(config),
            num_replicas=config.replicas,
            max_age=config.max_age_s,
            max_msg_size=config.max_message_bytes,
        ),
    )


async def ensure_consumer(js: JetStreamContext, config: JetStreamConfig, lane: Lane) -> str:
    """The durable pull consumer every worker of the lane's model shares; its name. Adding
    a durable with the same settings again is a no-op on the server."""
    name = config.lane_consumer(lane)
    await js.add_consumer(
        config.stream,
        ConsumerConfig(
            durable_name=name,
            filter_subject=config.lane_subject(lane),
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=config.ack_wait_s,
            max_deliver=config.max_deliver,
            max_ack_pending=config.max_ack_pending,
            # Workers fetch in bursts; the server keeps this many fetches of theirs open.
            max_waiting=512,
        ),
    )
    return name


async def workers_bucket(js: JetStreamContext, config: JetStreamConfig, ttl_s: float) -> KeyValue:
    """The KV bucket of live workers; a key not refreshed within ``ttl_s`` disappears."""
    try:
        return await js.key_value(config.workers_bucket)
    except BucketNotFoundError:
        pass
    try:
        return await js.create_key_value(
            KeyValueConfig(
                bucket=config.workers_bucket,
                ttl=ttl_s,
                history=1,
                storage=StorageType.MEMORY,  # liveness is worthless after a restart
                replicas=config.replicas,
            )
        )
    except BadRequestError:
        return await js.key_value(config.workers_bucket)  # created meanwhile by another
