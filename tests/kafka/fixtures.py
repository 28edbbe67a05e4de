"""The ``kafka_broker`` fixture: one real broker per test session, started the first time a
test asks for it (sessions that never do pay nothing), stopped when the session ends.
Tests share it, so each one names its own topics and groups (``unique_name``).

``secure_kafka`` is a second broker, one per module that asks for it, with the listeners
a managed cluster has: SASL_SSL (PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 users, the SCRAM
ones written at storage format) and SSL that requires a client certificate, both with a
certificate of a test CA made here (PEM keystore and truststore)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from bench.services.kafka.broker import KafkaBroker
from tests.certificates import Certificates, make_certificates

# mechanism -> (user, password)
SASL_USERS = {
    "PLAIN": ("alice", "alice-Pa55word"),
    "SCRAM-SHA-256": ("bob", "bob-Pa55word"),
    "SCRAM-SHA-512": ("carol", "carol-Pa55word"),
}
LOGIN = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    with KafkaBroker() as broker:
        yield broker


@dataclass(frozen=True)
class SecureKafka:
    broker: KafkaBroker
    certificates: Certificates

    @property
    def sasl_ssl(self) -> str:
        return self.broker.address("SECURE")

    @property
    def ssl(self) -> str:
        return self.broker.address("TLS")


def _secure_properties(files: Certificates) -> dict[str, str]:
    plain_user, plain_password = SASL_USERS["PLAIN"]
    properties = {
        "sasl.enabled.mechanisms": ",".join(SASL_USERS),
        "plain.sasl.jaas.config": (
            f'{LOGIN["PLAIN"]} required user_{plain_user}="{plain_password}";'
        ),
        "scram-sha-256.sasl.jaas.config": f"{LOGIN['SCRAM']} required;",
        "scram-sha-512.sasl.jaas.config": f"{LOGIN['SCRAM']} required;",
    }
    keystore = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(files.server_keystore)}
    client_auth = {
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
        "ssl.client.auth": "required",
    }
    return {
        **{f"listener.name.secure.{k}": v for k, v in (properties | keystore).items()},
        **{f"listener.name.tls.{k}": v for k, v in (keystore | client_auth).items()},
    }


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    files = make_certificates(tmp_path_factory.mktemp("kafka-certs"))
    scram = [
        argument
        for mechanism, (user, password) in SASL_USERS.items()
        if mechanism.startswith("SCRAM")
        for argument in ("--add-scram", f"{mechanism}=[name={user},password={password}]")
    ]
    broker = KafkaBroker(
        heap_mb=384,
        listeners={"SECURE": "SASL_SSL", "TLS": "SSL"},
        extra_properties=_secure_properties(files),
        format_args=scram,
    )
    with broker:
        yield SecureKafka(broker, files)
