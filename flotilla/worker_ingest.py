"""Kafka ingest inside a distributed worker (`flotilla worker --nats URL --kafka B --topic
T`): online requests from the shared queue and documents from this worker's share of
the topic's partitions, embedded by one worker on this device.

It is `flotilla serve --kafka`'s worker side (``wiring.local_stack``: the in-process
queue, the model host, the ingest core, the store) with the shared queue's jobs relayed
into the in-process queue (``embedder.queue.relay``), so both are batched by that queue's
one rule: online requests (short deadlines) first, ingest filling the rest of each
batch, and no ingest job waiting past its turn. The same supervised Kafka source
(``wiring.kafka_ingest``) gives the same guarantees: offsets committed after the store
confirmed, poison to the dead-letter topic, a consumer group shared by every worker
that ingests the topic.
"""

from __future__ import annotations

from embedder.host import ModelHost
from embedder.queue import JobPuller
from embedder.queue.relay import Relay
from embedder.tasks.embed.engine import LoadedEncoders
from embedder.tasks.kind import Loader
from flotilla import wiring
from flotilla.settings import Settings
from ingest.supervisor import IngestSupervisor


class WorkerIngest:
    """Built before anything starts: ``open`` claims the collection, ``start`` (models
    loaded, ``shared`` started) relays and ingests, ``stop`` at a stop signal, ``close``
    once the model host has stopped."""

    def __init__(self, settings: Settings, shared: JobPuller, loader: Loader | None) -> None:
        self.settings = settings
        self.stack = wiring.local_stack(settings, loader=loader, at_start=True)
        ingest = wiring.kafka_ingest(settings, self.stack.core)
        if ingest is None:
            raise SystemExit("ingesting from Kafka needs --kafka BOOTSTRAP and --topic TOPIC")
        self.ingest: IngestSupervisor = ingest
        loaded = LoadedEncoders(self.stack.host.engines)
        self.relay = Relay(
            shared,
            self.stack.queue,
            models=lambda: list(loaded),
            # About one batch of online requests in hand: the rest stays in the shared
            # queue, where an idle worker takes it.
            budget=lambda: max((m.limits.max_tokens for m in loaded.values()), default=0),
        )

    @property
    def host(self) -> ModelHost:
        return self.stack.host

    async def open(self) -> None:
        """Open the collection before any model loads: one of the embedded store that
        another process owns fails at once (409, the message names the owner)."""
        await wiring.claim_collections(self.stack, [self.settings.ingest.collection])

    async def start(self) -> None:
        await self.relay.start()
        await self.ingest.start()

    async def stop(self) -> None:
        """Stop taking online requests, then stop ingest: the chunk in flight is embedded
        (the worker still runs), written and committed, and the group is left."""
        await self.relay.stop()
        await self.ingest.stop()

    async def close(self) -> None:
        """After the model host stopped: the last replies go out, the store closes."""
        await self.stop()
        await self.relay.close()
        await self.stack.store.close()
