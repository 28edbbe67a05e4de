"""Following one single-partition topic alone, without a consumer group: what a gateway
does with its reply topic and with the workers' status topic."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from embedder.lifecycle import Lifecycle, cancel_and_wait, watch

log = logging.getLogger(__name__)

RETRY_S = 1.0  # after a failed fetch


class TopicReader(Lifecycle):
    """Reads partition 0 of ``topic`` from ``history`` records before its end (or its
    first record, if fewer are kept), handing each record to ``handle`` in order until
    stopped. ``what`` names the records in logs and the task; ``settings`` go to the
    consumer. Nothing is committed: a reader that starts again starts from the end again.
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        handle: Callable[[ConsumerRecord[bytes, bytes]], None],
        what: str,
        history: int = 0,
        **settings: Any,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.handle = handle
        self.what = what
        self.history = history
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None:
            return
        # Made here, not in __init__: aiokafka binds a client to the running loop.
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            **self.settings,
        )
        await self._consumer.start()
        partition = TopicPartition(self.topic, 0)
        self._consumer.assign([partition])
        # An offset fixed now, not resolved at the first fetch: a record written in
        # between (a reply to a request put at once) is read, not skipped.
        first = (await self._consumer.beginning_offsets([partition]))[partition]
        end = (await self._consumer.end_offsets([partition]))[partition]
        self._consumer.seek(partition, max(first, end - self.history))
        self._task = watch(asyncio.create_task(self._read(), name=f"kafka-{self.what}"))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)
        assert self._consumer is not None
        await self._consumer.stop()

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=1_000)
            except KafkaError:
                # Retried for as long as it takes: whoever waits on these records bounds
                # the wait itself (a request by its deadline, a worker by its beats' expiry).
                log.exception("reading %s from %s failed; retrying", self.what, self.topic)
                await asyncio.sleep(RETRY_S)
                continue
            for records in batches.values():
                for record in records:
                    self.handle(record)
