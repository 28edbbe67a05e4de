"""The NATS link's security against real nats-servers configured for it (a test CA and
certificates made here): the work queue's round trip over TLS with a password, with an
nkey, and with a .creds file in operator mode, and with a client certificate where the
server requires one; every refusal (a wrong password, an unknown nkey or account, no
credentials, an untrusted server certificate, another name, no client certificate, a
server without TLS) fails the first connection at once with the setting to fix, and
never shows a secret; a plaintext client is refused by the server itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from pydantic import ValidationError

from bench.services.nats import NatsServer
from embedder.core.errors import LinkRefused
from embedder.core.jobs import ApiShape, Job, JobResult, Timings
from embedder.queue.jetstream.config import JetStreamConfig
from embedder.queue.jetstream.connection import Connection
from embedder.queue.jetstream.puller import JetStreamPuller
from embedder.queue.jetstream.security import NatsSecurity, redacted
from embedder.queue.jetstream.submitter import JetStreamSubmitter
from tests.certificates import Certificates, make_certificates
from tests.kafka.fixtures import unique_name
from tests.nats.auth import OperatorMode, nkey_user, operator_mode
from tests.nats.fixtures import PASSWORD, USER, SecureNats, tls_block

REFUSED_WITHIN_S = 5.0  # a refusal ends the start at once, not after reconnecting


@pytest.fixture
def config() -> JetStreamConfig:
    tag = unique_name("s").replace("-", "_").upper()
    return JetStreamConfig(
        stream=f"SEC_{tag}", subject_prefix=f"sec.{tag}", storage="memory", max_bytes=1 << 24
    )


def job(job_id: str) -> Job:
    now = time.time()
    return Job(
        id=job_id,
        model="alpha",
        shape=ApiShape.TEI_EMBED,
        body=b'{"inputs": "x"}',
        est_tokens=4,
        deadline=now + 30,
        enqueued_at=now,
    )


async def round_trip(url: str, config: JetStreamConfig, security: NatsSecurity) -> bytes:
    """A job put by a gateway's submitter, pulled and answered by a worker's puller."""
    submitter = JetStreamSubmitter(
        url=url, inbox=unique_name("inbox"), config=config, security=security
    )
    puller = JetStreamPuller(url=url, config=config, security=security)
    async with submitter, puller, asyncio.timeout(10):
        future = await submitter.put(job("j1"))
        pulled: list[Job] = []
        while not pulled:
            pulled = await puller.pull(["alpha"], 100, 0.5)
        await puller.complete("j1", JobResult(b"answer", 3, Timings(0.01, 0.01)))
        return (await future).body


async def connect(url: str, name: str, security: NatsSecurity) -> Client:
    """A side's connection that needs nothing on the server: only the link is tested."""

    async def nothing() -> None:
        pass

    link = Connection(url, name, nothing, security)
    await link.open()
    return link.nc


async def refused(url: str, security: NatsSecurity) -> str:
    with pytest.raises(LinkRefused) as caught:
        async with asyncio.timeout(REFUSED_WITHIN_S):
            await connect(url, "flotilla-test", security)
    assert caught.value.retriable is False
    return caught.value.message


def secure(files: Certificates, **options: object) -> NatsSecurity:
    return NatsSecurity.model_validate({"tls_ca": files.ca, **options})


# -- TLS with users --------------------------------------------------------------------


async def test_round_trip_over_tls_with_a_password(
    secure_nats: SecureNats, config: JetStreamConfig
) -> None:
    security = secure(secure_nats.certificates, user=USER, password=PASSWORD)
    assert await round_trip(secure_nats.server.url, config, security) == b"answer"


async def test_an_nkey_seed_authenticates(secure_nats: SecureNats) -> None:
    security = secure(secure_nats.certificates, nkey_seed=secure_nats.nkey.seed_file)
    nc = await connect(secure_nats.server.url, "flotilla-test", security)
    try:
        await nc.flush(timeout=5)
    finally:
        await nc.close()


async def test_a_wrong_password_names_the_settings_and_not_the_password(
    secure_nats: SecureNats,
) -> None:
    security = secure(secure_nats.certificates, user=USER, password="not-the-Pa55word")
    message = await refused(secure_nats.server.url, security)
    assert "refused to authorize" in message
    assert "--nats-user (FLOTILLA_NATS_USER)" in message
    assert "--nats-password (FLOTILLA_NATS_PASSWORD)" in message
    assert "not-the-Pa55word" not in message and "not-the-Pa55word" not in repr(security)


async def test_no_credentials_name_every_way_in(secure_nats: SecureNats) -> None:
    message = await refused(secure_nats.server.url, secure(secure_nats.certificates))
    assert "requires credentials" in message
    for flag in ("--nats-creds", "--nats-nkey-seed", "--nats-user", "--nats-token"):
        assert flag in message


async def test_an_unknown_nkey_names_its_seed(secure_nats: SecureNats, tmp_path: Path) -> None:
    stranger = nkey_user(tmp_path, "stranger")
    security = secure(secure_nats.certificates, nkey_seed=stranger.seed_file)
    assert "--nats-nkey-seed" in await refused(secure_nats.server.url, security)


async def test_a_server_certificate_of_another_ca_names_the_ca_setting(
    secure_nats: SecureNats,
) -> None:
    files = secure_nats.certificates
    security = NatsSecurity(tls_ca=files.other_ca, user=USER, password=PASSWORD)
    message = await refused(secure_nats.server.url, security)
    assert "TLS verification" in message and "--nats-tls-ca (FLOTILLA_NATS_TLS_CA)" in message


async def test_a_name_the_certificate_lacks_names_the_server_name_setting(
    secure_nats: SecureNats,
) -> None:
    files = secure_nats.certificates
    security = secure(files, tls_server_name="elsewhere.example", user=USER, password=PASSWORD)
    message = await refused(secure_nats.server.url, security)
    assert "elsewhere.example" in message and "--nats-tls-server-name" in message


async def test_an_unreadable_ca_file_names_its_setting(
    secure_nats: SecureNats, tmp_path: Path
) -> None:
    security = NatsSecurity(tls_ca=tmp_path / "missing.pem", user=USER, password=PASSWORD)
    message = await refused(secure_nats.server.url, security)
    assert "missing.pem" in message and "--nats-tls-ca" in message


def test_a_plaintext_client_is_refused_by_the_server(secure_nats: SecureNats) -> None:
    """The server announces TLS and hangs up on a client that sends its CONNECT (and
    password) in the clear: it never answers the PING."""
    host, port = secure_nats.server.url.removeprefix("nats://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        lines = sock.makefile("rb")
        info = json.loads(lines.readline().removeprefix(b"INFO "))
        assert info["tls_required"] is True and info["auth_required"] is True
        hello = {"verbose": False, "user": USER, "pass": PASSWORD}
        sock.sendall(b"CONNECT " + json.dumps(hello).encode() + b"\r\nPING\r\n")
        assert lines.readline() == b""  # closed, no PONG


# -- a server that verifies its clients ---------------------------------------------------


@pytest.fixture(scope="module")
def client_verifying(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NatsServer, Certificates]]:
    files = make_certificates(tmp_path_factory.mktemp("client-certs"))
    with NatsServer(extra_config=tls_block(files, verify_clients=True)) as server:
        yield server, files


async def test_a_client_certificate_opens_a_server_that_requires_one(
    client_verifying: tuple[NatsServer, Certificates], config: JetStreamConfig
) -> None:
    server, files = client_verifying
    security = secure(files, tls_cert=files.client_cert, tls_key=files.client_key)
    assert await round_trip(server.url, config, security) == b"answer"


async def test_without_a_client_certificate_the_cert_settings_are_named(
    client_verifying: tuple[NatsServer, Certificates],
) -> None:
    server, files = client_verifying
    message = await refused(server.url, secure(files))
    assert "--nats-tls-cert (FLOTILLA_NATS_TLS_CERT)" in message
    assert "--nats-tls-key" in message


# -- operator mode: a .creds file ---------------------------------------------------------


@pytest.fixture(scope="module")
def operator_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NatsServer, OperatorMode]]:
    accounts = operator_mode(tmp_path_factory.mktemp("operator"))
    with NatsServer(extra_config=accounts.config) as server:
        yield server, accounts


async def test_a_creds_file_opens_the_work_queue_in_operator_mode(
    operator_server: tuple[NatsServer, OperatorMode], config: JetStreamConfig
) -> None:
    server, accounts = operator_server
    security = NatsSecurity(creds=accounts.creds)
    assert await round_trip(server.url, config, security) == b"answer"


async def test_creds_of_an_unknown_account_name_the_creds_setting(
    operator_server: tuple[NatsServer, OperatorMode],
) -> None:
    server, accounts = operator_server
    message = await refused(server.url, NatsSecurity(creds=accounts.stranger_creds))
    assert "--nats-creds (FLOTILLA_NATS_CREDS)" in message


# -- TLS set, a server without it ---------------------------------------------------------


async def test_tls_set_and_a_server_without_tls_is_refused(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    files = make_certificates(tmp_path)
    message = await refused(nats_server.url, secure(files))
    assert "offers no TLS" in message and "--nats-tls-ca" in message


@contextlib.asynccontextmanager
async def plaintext_impostor(heard: bytearray) -> AsyncIterator[str]:
    """A server that asks for credentials without offering TLS, and keeps what it hears."""

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        info = {"server_id": "x", "version": "2.15.1", "proto": 1, "max_payload": 1 << 20}
        writer.write(b"INFO " + json.dumps(info | {"auth_required": True}).encode() + b"\r\n")
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            heard.extend(await reader.read(65536))
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"nats://127.0.0.1:{port}"


async def test_with_tls_set_a_password_never_goes_out_in_plaintext(tmp_path: Path) -> None:
    heard = bytearray()
    files = make_certificates(tmp_path)
    async with plaintext_impostor(heard) as url:
        message = await refused(url, secure(files, user=USER, password=PASSWORD))
    assert "offers no TLS" in message
    assert PASSWORD.encode() not in heard


# -- the settings themselves --------------------------------------------------------------


def test_settings_that_only_work_together_or_alone_are_refused(tmp_path: Path) -> None:
    cases = [
        ({"tls_cert": tmp_path / "c.pem"}, "--nats-tls-key"),
        ({"user": "u"}, "--nats-password"),
        ({"password": "p"}, "--nats-user"),
        ({"tls_key": tmp_path / "c.key"}, "--nats-tls-cert"),
    ]
    for given, named in cases:
        with pytest.raises(ValidationError, match=named):
            NatsSecurity.model_validate(given)


def test_one_way_in_is_used_the_first_set() -> None:
    every = NatsSecurity(
        creds=Path("u.creds"), nkey_seed=Path("u.nk"), user="u", password="p", token="t"
    )
    assert every.way_in == "creds"
    assert NatsSecurity(user="u", password="p", token="t").way_in == "user"
    assert NatsSecurity(token="t").way_in == "token"
    assert NatsSecurity().way_in is None


def test_urls_lose_their_user_and_password_in_messages() -> None:
    assert redacted("nats://u:secret@a:4222, tls://b:4222") == "nats://a:4222,tls://b:4222"
    assert redacted("c:4222") == "c:4222"
