"""The distributed work queue behind one factory: `flotilla gateway` and `flotilla worker`
ask ``transport(settings)`` for their halves and never branch on what carries the
requests. One substrate does today, JetStream (--nats): a shared queue per message, so
any worker may take any request of a model it hosts. Kafka (--kafka) carries documents
to ingest, not requests: a partitioned log pins each request to one partition's owner."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from embedder.core.jobs import ModelStates
from embedder.queue.protocol import JobPuller, JobSubmitter
from flotilla.settings import Settings


class Submitter(JobSubmitter, Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class Puller(JobPuller, Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def drain(self, timeout_s: float) -> int: ...
    # each model's requests not yet answered, the models hosted or not
    async def waiting(self, models: Collection[str]) -> dict[str, int]: ...
    def taken_at(self, model: str) -> float | None: ...  # when a pull last took its jobs


class FleetView(ModelStates, Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    # the live workers but this one, each as its models' states (a worker's placement)
    def others(self, worker_id: str) -> list[dict[str, dict[str, Any]]]: ...


class Heartbeat(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def announce(self) -> None: ...  # now, not at the next beat


class Transport(Protocol):
    name: str  # what the logs say the requests travel on

    def submitter(self, settings: Settings) -> Submitter: ...
    def fleet_status(self, settings: Settings) -> FleetView: ...
    def puller(self, settings: Settings, worker_id: str) -> Puller: ...
    def heartbeat(
        self,
        settings: Settings,
        worker_id: str,
        models: Sequence[str],
        states: ModelStates,
        hosts: Callable[[], Collection[str]] = tuple,
    ) -> Heartbeat: ...


def _subject_safe(name: str) -> str:
    # No '*', '>' or whitespace, which NATS subjects forbid, nor anything else unusual.
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)


def reply_topic(settings: Settings) -> str:
    """This gateway's own reply inbox subject, <prefix>.<gateway id>."""
    gateway_id = settings.gateway_id or f"{socket.gethostname()}-{settings.port}"
    return f"{settings.reply_topic_prefix}.{_subject_safe(gateway_id)}"


class JetStreamTransport:
    """Its clients are imported only when this transport is chosen; each takes the
    settings' ``jetstream`` section as its config, and ``nats_security`` for its
    connection."""

    name = "jetstream"

    def submitter(self, settings: Settings) -> Submitter:
        from embedder.queue.jetstream.submitter import JetStreamSubmitter

        assert settings.nats
        return JetStreamSubmitter(
            url=settings.nats,
            inbox=reply_topic(settings),
            config=settings.jetstream,
            security=settings.nats_security,
        )

    def fleet_status(self, settings: Settings) -> FleetView:
        from embedder.queue.jetstream.liveness import FleetLiveness

        assert settings.nats
        return FleetLiveness(
            url=settings.nats, config=settings.jetstream, security=settings.nats_security
        )

    def puller(self, settings: Settings, worker_id: str) -> Puller:
        from embedder.queue.jetstream.puller import JetStreamPuller

        assert settings.nats
        return JetStreamPuller(
            url=settings.nats,
            config=settings.jetstream,
            name=f"flotilla-worker {worker_id}",
            security=settings.nats_security,
        )

    def heartbeat(
        self,
        settings: Settings,
        worker_id: str,
        models: Sequence[str],
        states: ModelStates,
        hosts: Callable[[], Collection[str]] = tuple,
    ) -> Heartbeat:
        from embedder.queue.jetstream.liveness import WorkerLiveness

        assert settings.nats
        return WorkerLiveness(
            url=settings.nats,
            worker_id=worker_id,
            models=models,
            states=states,
            config=settings.jetstream,
            security=settings.nats_security,
            hosts=hosts,
        )


# Which setting selects which substrate, in order of precedence.
TRANSPORTS: dict[str, Callable[[], Transport]] = {
    "nats": JetStreamTransport,
}


def transport(settings: Settings) -> Transport:
    for setting, make in TRANSPORTS.items():
        if getattr(settings, setting):
            return make()
    raise SystemExit(
        "the distributed queue needs --nats URL (FLOTILLA_NATS), a NATS server with "
        "JetStream; --kafka carries documents to ingest, not requests"
    )
