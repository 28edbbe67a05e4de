"""The Qdrant server path over TLS, against the store server (the facade) served over
https with a CA and certificates made here (trustme): the store works with the CA; a CA
it lacks, a plain-http URL to the TLS port, an https URL to a plain port and a client
certificate missing or refused each fail at start, naming the setting to change."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from flotilla import wiring
from flotilla.settings import Settings
from ingest.store import InvalidStoreRequest, Point, StoreMisconfigured, point_id
from ingest.store.qdrant import QdrantStore
from tests.ingest.store.server_fixture import (
    REPO,
    free_port,
    start_store_server,
    stop,
    wait_ready,
)

pytestmark = pytest.mark.slow

DIM = 4
MODEL = "test-model"


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA the server's certificate chains to
    cert: Path  # the server's, for 127.0.0.1 and localhost
    key: Path
    client: Path  # a client certificate of the same CA, its key in the same file
    stranger: Path  # a client certificate of another CA


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    files = Pki(*(folder / f"{n}.pem" for n in ("ca", "cert", "key", "client", "stranger")))
    ca.cert_pem.write_to_path(str(files.ca))
    server.cert_chain_pems[0].write_to_path(str(files.cert))
    server.private_key_pem.write_to_path(str(files.key))
    ca.issue_cert("client").private_key_and_cert_chain_pem.write_to_path(str(files.client))
    other.issue_cert("client").private_key_and_cert_chain_pem.write_to_path(str(files.stranger))
    return files


@contextlib.contextmanager
def tls_server(folder: Path, pki: Pki, *, client_certs: bool = False) -> Iterator[int]:
    """The store server over TLS (requiring client certificates of ``pki``'s CA if
    ``client_certs``); yields its port."""
    port, log = free_port(), folder / "server.log"
    extra = ["--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key)]
    if client_certs:
        extra += ["--ssl-client-ca", str(pki.ca)]
    proc = start_store_server(folder / "vectors", port, log, extra=extra)
    try:
        context = ssl.create_default_context(cafile=pki.ca)
        if client_certs:
            context.load_cert_chain(pki.client)
        wait_ready(f"https://127.0.0.1:{port}", proc, log, verify=context)
        yield port
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def tls_port(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[int]:
    with tls_server(tmp_path_factory.mktemp("tls-server"), pki) as port:
        yield port


async def round_trip(store: QdrantStore) -> None:
    """A collection made, a point written, read back and found."""
    collection = f"docs-{uuid.uuid4().hex[:8]}"
    await store.ensure_collection(collection, DIM, "cosine", MODEL)
    point = Point(point_id(collection, "a"), [1.0, 0.0, 0.0, 0.0], {"doc_id": "a"})
    await store.upsert(collection, [point])
    (got,) = await store.retrieve(collection, [point.id])
    assert (got.id, got.payload) == (point.id, point.payload)
    (hit,) = await store.search(collection, [1.0, 0.0, 0.0, 0.0], limit=1)
    assert hit.id == point.id


async def test_the_store_works_over_https_with_the_ca(pki: Pki, tls_port: int) -> None:
    for host in ("127.0.0.1", "localhost"):  # the name checked against the certificate
        url = f"https://{host}:{tls_port}"
        async with QdrantStore(url=url, api_key="secret", ca_file=pki.ca) as store:
            await round_trip(store)


async def test_without_the_ca_start_fails_naming_the_setting(tls_port: int) -> None:
    """The system's trust store does not know the test CA."""
    store = QdrantStore(url=f"https://127.0.0.1:{tls_port}")
    with pytest.raises(StoreMisconfigured) as caught:
        async with store:
            pass
    message = caught.value.message
    assert message.startswith(
        f"TLS verification of the Qdrant server at https://127.0.0.1:{tls_port}"
    )
    assert "--qdrant-ca-file (FLOTILLA_QDRANT_CA_FILE)" in message
    assert not caught.value.retriable
    assert store.closed  # left behind by the failed start


async def test_another_ca_fails_the_same_way(pki: Pki, tls_port: int) -> None:
    """A CA file that does not vouch for the server: the stranger's certificate stands
    in for another CA's file (a PEM certificate all the same)."""
    store = QdrantStore(url=f"https://127.0.0.1:{tls_port}", ca_file=pki.stranger)
    with pytest.raises(StoreMisconfigured, match=r"TLS verification .* --qdrant-ca-file"):
        await store.start()
    await store.close()


async def test_plain_http_to_the_tls_port_fails_clearly(tls_port: int) -> None:
    store = QdrantStore(url=f"http://127.0.0.1:{tls_port}")
    with pytest.raises(StoreMisconfigured) as caught:
        await store.start()
    await store.close()
    assert caught.value.message == (
        f"the Qdrant server at http://127.0.0.1:{tls_port} speaks TLS: use https:// in "
        "--qdrant-url (FLOTILLA_QDRANT_URL)"
    )


async def test_https_to_a_plain_server_fails_clearly(pki: Pki, store_server_url: str) -> None:
    url = store_server_url.replace("http://", "https://")
    store = QdrantStore(url=url, ca_file=pki.ca)
    with pytest.raises(StoreMisconfigured, match="does not speak TLS: use http:// in --qdrant-url"):
        await store.start()
    await store.close()


async def test_a_server_that_requires_client_certificates(pki: Pki, tmp_path: Path) -> None:
    with tls_server(tmp_path, pki, client_certs=True) as port:
        url = f"https://127.0.0.1:{port}"
        async with QdrantStore(url=url, ca_file=pki.ca, client_cert=pki.client) as store:
            await round_trip(store)
        for cert, says in [
            (None, "may require a client certificate: give one with --qdrant-client-cert"),
            (pki.stranger, "does not accept this client certificate: check --qdrant-client-cert"),
        ]:
            store = QdrantStore(url=url, ca_file=pki.ca, client_cert=cert)
            with pytest.raises(StoreMisconfigured, match=says):
                await store.start()
            await store.close()


def test_tls_options_are_refused_where_they_would_go_unused(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(InvalidStoreRequest, match="use https:// in --qdrant-url"):
        QdrantStore(url="http://127.0.0.1:6333", ca_file=pki.ca)
    with pytest.raises(InvalidStoreRequest, match="give the certificate with --qdrant-client-cert"):
        QdrantStore(url="https://127.0.0.1:6333", client_key=pki.key)
    with pytest.raises(InvalidStoreRequest, match="gRPC"):
        QdrantStore(url="https://127.0.0.1:6333", ca_file=pki.ca, prefer_grpc=True)
    with pytest.raises(InvalidStoreRequest, match="check --qdrant-ca-file"):
        QdrantStore(url="https://127.0.0.1:6333", ca_file=tmp_path / "missing.pem")
    (tmp_path / "junk.pem").write_text("not a certificate", encoding="utf-8")
    with pytest.raises(InvalidStoreRequest, match="check --qdrant-client-cert"):
        QdrantStore(url="https://127.0.0.1:6333", client_cert=tmp_path / "junk.pem")


async def test_the_settings_reach_the_store_and_keep_the_key_hidden(
    pki: Pki, tls_port: int, clean_env: None
) -> None:
    settings = Settings(
        store="qdrant",
        qdrant_url=f"https://127.0.0.1:{tls_port}",
        qdrant_api_key="top-secret",
        qdrant_ca_file=pki.ca,
    )
    assert "top-secret" not in f"{settings!r} {settings} {settings.model_dump()}"
    async with wiring.configured_store(settings) as store:
        assert isinstance(store, QdrantStore)
        await round_trip(store)
    unverified = settings.updated(qdrant_ca_file=None)
    with pytest.raises(StoreMisconfigured, match="--qdrant-ca-file"):
        async with wiring.configured_store(unverified):
            pass


def test_the_command_fails_at_start_naming_the_setting(
    tls_port: int, tmp_path: Path, clean_env: None
) -> None:
    """`flotilla ingest` into a server it cannot verify: exit 1 before any model loads,
    the message naming the flag, the API key nowhere in the output."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "hello"}\n', encoding="utf-8")
    url = f"https://127.0.0.1:{tls_port}"
    args = ["--from", str(docs), "--store", "qdrant", "--qdrant-url", url]
    result = subprocess.run(
        [sys.executable, "-m", "flotilla", "ingest", *args, "--qdrant-api-key", "top-secret"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert f"error: TLS verification of the Qdrant server at {url} failed" in result.stderr
    assert "check --qdrant-ca-file (FLOTILLA_QDRANT_CA_FILE)" in result.stderr
    assert "top-secret" not in result.stdout + result.stderr
