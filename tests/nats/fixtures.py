"""The ``nats_server`` fixture: one real nats-server per test session, started the first
time a test asks for it, stopped when the session ends. Tests share it, so each names
its own streams, subjects and buckets (``tests.kafka.fixtures.unique_name``).
``secure_nats`` is another, that speaks only TLS and knows its users: a user with a
password and an nkey user.

``nats_cluster``: three clustered nats-servers, for replicated streams, shared the same
way. A test that kills or restarts a node leaves every node running and the cluster
healthy again (``NatsCluster.restart``), as the next test expects to find it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from bench.services.nats import NatsCluster, NatsServer
from tests.certificates import Certificates, make_certificates
from tests.nats.auth import NkeyUser, nkey_user

USER, PASSWORD = "alice", "alice-Pa55word"


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server


@dataclass(frozen=True)
class SecureNats:
    server: NatsServer
    certificates: Certificates
    nkey: NkeyUser


def tls_block(certificates: Certificates, *, verify_clients: bool = False) -> str:
    """TLS only; with ``verify_clients``, a client certificate the CA signed is required."""
    lines = [f'cert_file: "{certificates.server_cert}"', f'key_file: "{certificates.server_key}"']
    if verify_clients:
        lines += [f'ca_file: "{certificates.ca}"', "verify: true"]
    return "tls {\n" + "\n".join(lines) + "\n}\n"


@pytest.fixture(scope="session")
def secure_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureNats]:
    folder = tmp_path_factory.mktemp("secure-nats")
    certificates = make_certificates(folder)
    nkey = nkey_user(folder)
    users = f'{{user: {USER}, password: "{PASSWORD}"}}, {{nkey: {nkey.public_key}}}'
    config = tls_block(certificates) + f"authorization {{ users: [ {users} ] }}\n"
    with NatsServer(extra_config=config) as server:
        yield SecureNats(server, certificates, nkey)


@pytest.fixture(scope="session")
def nats_cluster() -> Iterator[NatsCluster]:
    with NatsCluster(3) as cluster:
        yield cluster
