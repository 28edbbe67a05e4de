"""Connections that stall or leave, against the real server (uvicorn as `flotilla serve`
sets it up) over raw sockets: a body that stops arriving gets 408 within
--body-timeout-s, headers that stop arriving are dropped after --header-timeout-s, and
a client that leaves mid-request is a debug line, never a traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from flotilla.settings import Settings
from tests.gateway.conftest import Loader, StackFactory
from tests.gateway.live import Live, live_server

TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with live_server(Settings(header_timeout_s=TIMEOUT_S, body_timeout_s=TIMEOUT_S)) as server:
        yield server


def read_until_closed(sock: socket.socket, limit_s: float = 10) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed."""
    start = time.monotonic()
    sock.settimeout(limit_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - start


def read_response(sock: socket.socket, limit_s: float = 10) -> bytes:
    """One whole response, its body by content-length: on a busy machine the server's
    writes can come apart, the body after the headers."""
    sock.settimeout(limit_s)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    headers, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in headers.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return headers + b"\r\n\r\n" + body


def head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: flotilla\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("path", ["/embed", "/v1/embeddings"])
def test_a_body_that_stops_arriving_gets_408_and_the_connection_closes(
    live: Live, path: str
) -> None:
    body = json.dumps({"model": "alpha", "inputs": "x", "input": "x"}).encode()
    with live.connect() as sock:
        sock.sendall(head(path, len(body)) + body[: len(body) // 2])
        answer, closed_after_s = read_until_closed(sock)
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 408 Request Timeout", answer
    assert TIMEOUT_S * 0.9 <= closed_after_s < TIMEOUT_S + 3
    assert b"connection: close" in rest.lower()
    error = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    message = error["error"]["message"] if path.startswith("/v1/") else error["error"]
    assert f"after {len(body) // 2} bytes of {len(body)}" in message
    assert "--body-timeout-s" in message


def test_a_slow_body_that_keeps_arriving_is_served(live: Live) -> None:
    # The deadline is on each wait for more of the body, not on the whole upload.
    body = json.dumps({"inputs": "a slow but steady upload"}).encode()
    with live.connect() as sock:
        sock.sendall(head("/embed", len(body)))
        for i in range(0, len(body), 8):  # 4 pieces over 4 x 0.3 s > TIMEOUT_S in all
            time.sleep(TIMEOUT_S * 0.6)
            sock.sendall(body[i : i + 8])
        sock.settimeout(10)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /embed HTTP/1.1\r\nhost: flotilla\r\n", b"GET /hea"],
    ids=["nothing", "half the headers", "half the request line"],
)
def test_headers_that_stop_arriving_are_dropped(live: Live, sent: bytes) -> None:
    with live.connect() as sock:
        sock.sendall(sent)
        answer, closed_after_s = read_until_closed(sock)
    assert answer == b""
    assert TIMEOUT_S * 0.9 <= closed_after_s < TIMEOUT_S + 3


def test_a_kept_alive_connection_that_stalls_in_its_next_headers_is_dropped(
    live: Live,
) -> None:
    with live.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: flotilla\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 200 OK")
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: fl")  # the next request stalls
        answer, closed_after_s = read_until_closed(sock)
    assert answer == b""
    assert closed_after_s < TIMEOUT_S + 3


def test_a_client_leaving_mid_body_is_logged_at_debug_without_a_traceback(
    live: Live, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with live.connect() as sock:
        sock.sendall(head("/embed", 100) + b'{"inputs": "x')
        time.sleep(0.1)
    _until(lambda: any("client left" in r.getMessage() for r in caplog.records))
    time.sleep(0.1)
    _no_errors(caplog)
    (left,) = [r for r in caplog.records if "client left" in r.getMessage()]
    assert left.levelno == logging.DEBUG and left.exc_info is None
    assert "after sending 13 bytes" in left.getMessage()


def test_a_client_leaving_while_its_batch_runs_is_logged_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    gate = threading.Event()
    loader = Loader(forward_gate=gate)
    with live_server(loader=loader) as server:
        try:
            body = json.dumps({"inputs": "held at the device"}).encode()
            with server.connect() as sock:
                sock.sendall(head("/embed", len(body)) + body)
                assert loader.runtimes["alpha"].entered.wait(10)
            _until(lambda: any("closed the connection" in r.getMessage() for r in caplog.records))
        finally:
            gate.set()
        # The server goes on serving.
        assert httpx.post(f"{server.url}/embed", json={"inputs": "next"}).status_code == 200
    _no_errors(caplog)
    (left,) = [r for r in caplog.records if "closed the connection" in r.getMessage()]
    assert left.levelno == logging.DEBUG and left.exc_info is None


async def test_body_timeout_in_process_is_408_in_the_route_shape(make_stack: StackFactory) -> None:
    async with make_stack(Settings(body_timeout_s=0.2)) as s:

        async def stalls() -> object:
            yield b'{"model": "alpha", '
            await asyncio.sleep(30)
            yield b'"input": "x"}'

        response = await asyncio.wait_for(s.client.post("/v1/embeddings", content=stalls()), 5)
        assert response.status_code == 408
        error = response.json()["error"]
        assert error["type"] == "request_timeout" and "--body-timeout-s" in error["message"]
        assert not s.queue.jobs


def _until(condition: object, limit_s: float = 10) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _no_errors(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]
