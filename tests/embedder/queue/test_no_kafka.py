"""The queue of one machine needs no broker client: its gateway and workers import
``embedder.queue`` and ``embedder.queue.inprocess`` without aiokafka or nats, and the
JetStream work queue needs no aiokafka (checked in a fresh interpreter, since this test
process may have imported either already)."""

from __future__ import annotations

import pytest

from tests.gateway.test_no_torch import heavy_modules_after

KAFKA = ("aiokafka",)


@pytest.mark.parametrize(
    "modules",
    [
        ("embedder.queue", "embedder.queue.inprocess"),
        # The one-machine gateway and worker, as `flotilla serve` wires them.
        ("gateway.app", "gateway.service", "embedder.host", "embedder.tasks.embed.worker"),
        # Requests travel on JetStream: only ingest talks to Kafka.
        ("embedder.queue.jetstream.submitter", "embedder.queue.jetstream.puller"),
        # The settings hold the Kafka link's security without its client.
        ("flotilla.settings", "ingest.kafka_security"),
    ],
)
def test_these_imports_leave_aiokafka_out(modules: tuple[str, ...]) -> None:
    assert heavy_modules_after(*modules, heavy=KAFKA) == []


def test_the_probe_sees_aiokafka_when_it_is_imported() -> None:
    """Guards the guard: the same probe reports aiokafka once a Kafka client is imported."""
    loaded = heavy_modules_after("ingest.kafka_source", heavy=KAFKA)
    assert "aiokafka" in loaded


NATS = ("nats",)


@pytest.mark.parametrize(
    "modules",
    [
        ("embedder.queue", "embedder.queue.inprocess"),
        ("gateway.app", "gateway.service", "embedder.host", "embedder.tasks.embed.worker"),
        # The JetStream message format: its package must not drag the client in either.
        ("embedder.queue.jetstream", "embedder.queue.jetstream.wire"),
        # The settings hold the NATS link's security without the client.
        ("flotilla.settings", "embedder.queue.jetstream.security"),
    ],
)
def test_these_imports_leave_nats_out(modules: tuple[str, ...]) -> None:
    assert heavy_modules_after(*modules, heavy=NATS) == []


def test_the_probe_sees_nats_when_it_is_imported() -> None:
    loaded = heavy_modules_after("embedder.queue.jetstream.submitter", heavy=NATS)
    assert "nats" in loaded
