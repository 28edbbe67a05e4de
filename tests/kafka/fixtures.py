"""The ``kafka_broker`` fixture: one real broker per test session, started the first time a
test asks for it (sessions that never do pay nothing), stopped when the session ends.
Tests share it, so each one names its own topics and groups (``unique_name``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from bench.services.kafka.broker import KafkaBroker


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    with KafkaBroker() as broker:
        yield broker
