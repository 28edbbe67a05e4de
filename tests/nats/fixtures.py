"""The ``nats_server`` fixture: one real nats-server per test session, started the first
time a test asks for it, stopped when the session ends. Tests share it, so each names
its own streams, subjects and buckets (``tests.kafka.fixtures.unique_name``).

``nats_cluster``: three clustered nats-servers, for replicated streams, shared the same
way. A test that kills or restarts a node leaves every node running and the cluster
healthy again (``NatsCluster.restart``), as the next test expects to find it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.services.nats import NatsCluster, NatsServer


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server


@pytest.fixture(scope="session")
def nats_cluster() -> Iterator[NatsCluster]:
    with NatsCluster(3) as cluster:
        yield cluster
