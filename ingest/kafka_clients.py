"""Every Kafka client flotilla makes is made here: the consumer, producers, admin clients
and the raw client of ``ingest.raw_batches``, each with the link's security
(``ingest.kafka_security``) applied, so no client reaches a broker another way.

aiokafka reports a client that could not start as 'Unable to bootstrap', the reason only
logged. ``start`` asks a broker once more, on its own connection, why: a refusal of the
link's security (a rejected password, a certificate that fails verification) becomes a
``LinkRefused`` naming the setting to fix; anything else (the broker down) is raised as
it was, for the caller's retries.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from embedder.core.errors import LinkRefused
from ingest.kafka_security import KafkaSecurity

PROBE_TIMEOUT_MS = 10_000
TLS_ALERT_WAIT_S = 2.0  # a broker that took the handshake waits for a request: no alert
CLOSE_WAIT_S = 1.0


@dataclass(frozen=True)
class KafkaClients:
    """The brokers at ``bootstrap`` (host:port,...), reached with ``security``."""

    bootstrap: str
    security: KafkaSecurity = field(default_factory=KafkaSecurity)

    def consumer(self, *topics: str, **options: Any) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(*topics, **self._with(options))

    def producer(self, **options: Any) -> AIOKafkaProducer:
        return AIOKafkaProducer(**self._with(options))

    def admin(self, **options: Any) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self._with(options))

    def client(self, **options: Any) -> AIOKafkaClient:
        return AIOKafkaClient(**self._with(options))

    def _with(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap, **self.security.client_options(), **options}

    async def start(self, starting: Awaitable[None]) -> None:
        """Await a client's ``start()`` (a raw client's ``bootstrap()``); a failure that
        is a refusal of the link's security raises as ``LinkRefused``."""
        try:
            await starting
        except KafkaConnectionError:
            refused = await self.refusal()
            if refused is None:
                raise
            raise refused from refused.__cause__  # the probe's error: the reason itself

    async def refusal(self) -> LinkRefused | None:
        """Why the brokers refuse this link, asked of each bootstrap broker in turn; None
        when none refuses it (they are up and let it in, or unreachable)."""
        for host, port, _ in collect_hosts(self.bootstrap, randomize=False):
            broker = f"the Kafka broker {host}:{port}"
            try:
                conn = await create_conn(
                    host,
                    port,
                    request_timeout_ms=PROBE_TIMEOUT_MS,
                    max_idle_ms=None,
                    **self.security.client_options(),
                )
            except Exception as exc:
                refused = self._classify(exc, broker) or await self._tls_refusal(host, port)
                if refused is not None:
                    refused.__cause__ = refused.__cause__ or exc
                    return refused
            else:
                await _closed(conn.close())
        return None

    async def _tls_refusal(self, host: str, port: int) -> LinkRefused | None:
        """The TLS alert aiokafka reports as a closed connection: under TLS 1.3 a broker
        refuses a client certificate (or its absence) only after the handshake, so it is
        read here, as the first thing the broker sends."""
        if not self.security.tls:
            return None
        writer = None
        try:
            async with asyncio.timeout(TLS_ALERT_WAIT_S):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=self.security.tls_files().context()
                )
                await reader.read(1)
        except (OSError, TimeoutError) as exc:
            refused = self.security.tls_files().refusal(exc, f"the Kafka broker {host}:{port}")
            if refused is not None:
                refused.__cause__ = exc
            return refused
        finally:
            if writer is not None:
                writer.close()
                await _closed(writer.wait_closed())
        return None

    def _classify(self, exc: Exception, broker: str) -> LinkRefused | None:
        security = self.security
        if isinstance(exc, SaslAuthenticationFailed):
            # No user name either: ingest's health shows this message over HTTP, and a
            # managed cluster's user name is its API key.
            return LinkRefused(
                f"{broker} refused SASL {security.sasl_mechanism} authentication ({exc}): "
                f"check {security.named('sasl_username')}, {security.named('sasl_password')}"
                f" and {security.named('sasl_mechanism')}"
            )
        if isinstance(exc, UnsupportedSaslMechanismError):
            return LinkRefused(
                f"{broker} does not offer SASL {security.sasl_mechanism} ({exc}): choose one "
                f"it offers with {security.named('sasl_mechanism')}"
            )
        return security.tls_files().refusal(exc, broker)


async def _closed(closing: Awaitable[None]) -> None:
    """Wait for a probe's connection to close: a TLS close waits for the broker's answer,
    and a connection left closing when its loop ends is never closed."""
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await closing
