"""TLS to a Qdrant server: the context ``QdrantStore`` verifies the server with (and shows
its own certificate from), and, when its first call fails at start, what the server's
port says to a plain TCP probe, as a message that names the setting to change.

qdrant-client hands its extra keyword arguments to httpx in REST mode, so the context
goes in as httpx's ``verify``. Its gRPC channel takes neither a CA nor a client
certificate, so the store refuses these options with ``prefer_grpc``. Without a CA file
an https server is verified against the system's trust store (OpenSSL's default paths,
which ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` override), not the bundle httpx ships: the
system store is where a deployment installs its own CA.

The messages name the settings by their flags and variables (as the gateway's limits
do): the store is configured through them, and a user reads the message, not the code.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from ingest.store.errors import InvalidStoreRequest

URL = "--qdrant-url (FLOTILLA_QDRANT_URL)"
CA_FILE = "--qdrant-ca-file (FLOTILLA_QDRANT_CA_FILE)"
CLIENT_CERT = "--qdrant-client-cert (FLOTILLA_QDRANT_CLIENT_CERT)"
CLIENT_KEY = "--qdrant-client-key (FLOTILLA_QDRANT_CLIENT_KEY)"
DEFAULT_PORT = 6333  # qdrant-client's when the URL names none
PROBE_TIMEOUT_S = 5.0


def tls_context(
    url: str,
    *,
    ca_file: Path | None = None,
    client_cert: Path | None = None,
    client_key: Path | None = None,
) -> ssl.SSLContext | None:
    """What an https ``url`` is verified with (and the client certificate it is shown);
    None for http, where the TLS options are refused rather than silently unused."""
    given = [n for n, v in ((CA_FILE, ca_file), (CLIENT_CERT, client_cert)) if v is not None]
    if client_key is not None and client_cert is None:
        raise InvalidStoreRequest(
            f"{CLIENT_KEY} is the key of a client certificate: give the certificate with "
            f"{CLIENT_CERT}"
        )
    if not is_https(url):
        if given:
            raise InvalidStoreRequest(
                f"{' and '.join(given)} apply to a Qdrant server over TLS, and {url} is not "
                f"one: use https:// in {URL}"
            )
        return None
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise InvalidStoreRequest(f"cannot read the CA file: {exc}: check {CA_FILE}") from None
    if client_cert is not None:
        try:
            context.load_cert_chain(client_cert, client_key)
        except (OSError, ValueError) as exc:
            raise InvalidStoreRequest(
                f"cannot read the client certificate {client_cert} or its key: {exc}: check "
                f"{CLIENT_CERT} and {CLIENT_KEY} (PEM; the key in the certificate's file "
                "when no key file is given)"
            ) from None
    return context


def is_https(url: str) -> bool:
    return url.lower().startswith("https://")


async def misconfigured(
    url: str, context: ssl.SSLContext | None, *, client_cert: bool
) -> str | None:
    """Why the server at ``url`` refuses this client's way of speaking to it, probed
    afresh: TLS where the URL says http, none where it says https, a certificate the CA
    does not vouch for, a client certificate missing or refused. None when the port does
    not answer (the server is down, which writes wait out) or shows no such fault."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host, port = parts.hostname or "localhost", parts.port or DEFAULT_PORT
    return await asyncio.to_thread(_probe, url, host, port, context, client_cert)


def _probe(
    url: str, host: str, port: int, context: ssl.SSLContext | None, client_cert: bool
) -> str | None:
    try:
        raw = socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S)
    except OSError:
        return None  # nothing listens: down, not misconfigured
    with raw:  # a wrapped socket takes the connection over; this closes it otherwise
        if context is None:
            return _plain_url_fault(raw, host, url)
        return _tls_url_fault(raw, (host, port), url, context, client_cert)


def _plain_url_fault(raw: socket.socket, host: str, url: str) -> str | None:
    """An http:// URL: a port that completes a TLS handshake wants https://."""
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    try:
        with unverified.wrap_socket(raw, server_hostname=host):
            pass
    except OSError:
        return None
    return f"the Qdrant server at {url} speaks TLS: use https:// in {URL}"


def _tls_url_fault(
    raw: socket.socket,
    address: tuple[str, int],
    url: str,
    context: ssl.SSLContext,
    client_cert: bool,
) -> str | None:
    host = address[0]
    try:
        tls = context.wrap_socket(raw, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        return (
            f"TLS verification of the Qdrant server at {url} failed ({exc.verify_message}): "
            f"check {CA_FILE} (without it the server is verified against the system's trust "
            "store)"
        )
    except ssl.SSLError as exc:
        if _speaks_plain_http(address):
            return f"the Qdrant server at {url} does not speak TLS: use http:// in {URL}"
        return f"the TLS handshake with the Qdrant server at {url} failed ({exc}): check {URL}"
    except OSError:
        return None  # reset or timed out mid-handshake: nothing to say of the settings
    with tls:
        return _refused_after_handshake(tls, host, url, client_cert)


def _refused_after_handshake(
    tls: ssl.SSLSocket, host: str, url: str, client_cert: bool
) -> str | None:
    """TLS 1.3 completes the handshake before the server checks the client's certificate;
    a server that refuses it (or wants one) then closes the connection unanswered."""
    try:
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        if tls.recv(1):
            return None  # it answers this client: what failed was not the TLS settings
    except TimeoutError:
        return None  # slow, not refusing
    except OSError:
        pass  # an alert or a reset right after the handshake
    closed = f"the Qdrant server at {url} closed the connection after the TLS handshake"
    if client_cert:
        return (
            f"{closed}: it does not accept this client certificate: check {CLIENT_CERT} and "
            f"{CLIENT_KEY}"
        )
    return f"{closed}: it may require a client certificate: give one with {CLIENT_CERT}"


def _speaks_plain_http(address: tuple[str, int]) -> bool:
    request = f"HEAD / HTTP/1.1\r\nHost: {address[0]}\r\nConnection: close\r\n\r\n"
    try:
        with socket.create_connection(address, timeout=PROBE_TIMEOUT_S) as plain:
            plain.sendall(request.encode())
            return plain.recv(5) == b"HTTP/"
    except OSError:
        return False
