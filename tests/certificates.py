"""A test certificate authority and the files servers and clients read: made in the test
(trustme), so no certificate is checked in and none expires under the suite."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA, a server's (for 127.0.0.1 and localhost) and a client's;
    ``server_keystore`` holds the server's key and chain in one file (Kafka's PEM
    keystore). ``other_ca`` signed none of them: a client trusting it must refuse."""

    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    server_keystore: Path
    client_cert: Path
    client_key: Path


def _pkcs8(pem: bytes) -> bytes:
    # Kafka reads PKCS#8 keys only; trustme writes the traditional OpenSSL form.
    key = serialization.load_pem_private_key(pem, password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_certificates(folder: Path) -> Certificates:
    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(key_type=trustme.KeyType.RSA)
    server = ca.issue_cert("127.0.0.1", "localhost", key_type=trustme.KeyType.RSA)
    client = ca.issue_cert("flotilla-client", key_type=trustme.KeyType.RSA)
    files = Certificates(
        ca=folder / "ca.pem",
        other_ca=folder / "other-ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        server_keystore=folder / "server-keystore.pem",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
    )
    ca.cert_pem.write_to_path(str(files.ca))
    trustme.CA().cert_pem.write_to_path(str(files.other_ca))
    chain = b"".join(blob.bytes() for blob in server.cert_chain_pems)
    server_key = _pkcs8(server.private_key_pem.bytes())
    files.server_cert.write_bytes(chain)
    files.server_key.write_bytes(server_key)
    files.server_keystore.write_bytes(server_key + chain)
    files.client_cert.write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))
    files.client_key.write_bytes(_pkcs8(client.private_key_pem.bytes()))
    for key in (files.server_key, files.server_keystore, files.client_key):
        key.chmod(0o600)
    return files
