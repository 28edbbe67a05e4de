"""The ``nats_server`` fixture: one real nats-server per test session, started the first
time a test asks for it, stopped when the session ends. Tests share it, so each names
its own streams, subjects and buckets (``tests.kafka.fixtures.unique_name``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.services.nats import NatsServer


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server
