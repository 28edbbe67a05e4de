"""`flotilla gateway` and `flotilla worker` over a NATS server that speaks only TLS and
wants a user and password: wired as their commands wire them, from FLOTILLA_* variables,
requests answered and liveness seen through the secured link; a wrong password stops
either at start with the setting to fix, and the real `flotilla gateway` process says so
on its way out without ever printing the password."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from embedder.core.errors import LinkRefused
from flotilla.distributed import build_gateway_app, run_worker
from flotilla.settings import Settings
from tests.distributed.cluster import free_port
from tests.distributed.test_gateway_jetstream import gateway, until_ready, worker
from tests.fakes import FakeLoader
from tests.kafka.fixtures import unique_name
from tests.nats.fixtures import PASSWORD, USER, SecureNats

pytestmark = pytest.mark.slow  # starts the server

WRONG = "wrong-Pa55word"


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    profile = {"cpu": {"max_batch_tokens": 512, "max_batch_requests": 16, "max_wait_ms": 1}}
    models = {"alpha": {"source": {"path": str(tmp_path)}, "max_tokens": 64, "profiles": profile}}
    path.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
    return path


@pytest.fixture
def secured(
    secure_nats: SecureNats, fleet: Path, monkeypatch: pytest.MonkeyPatch, clean_env: None
) -> dict[str, str]:
    """The queue's settings as a deployment gives them: FLOTILLA_* variables."""
    stream = unique_name("SECURE").replace("-", "_")
    env = {
        "FLOTILLA_NATS": secure_nats.server.url,
        "FLOTILLA_NATS_TLS_CA": str(secure_nats.certificates.ca),
        "FLOTILLA_NATS_USER": USER,
        "FLOTILLA_NATS_PASSWORD": PASSWORD,
        "FLOTILLA_NATS_STREAM": stream,
        "FLOTILLA_NATS_SUBJECT_PREFIX": f"jobs.{stream}",
        "FLOTILLA_NATS_STORAGE": "memory",
        "FLOTILLA_NATS_MAX_BYTES": str(16 * 1024 * 1024),
        "FLOTILLA_REPLY_TOPIC_PREFIX": unique_name("replies"),
        "FLOTILLA_GATEWAY_ID": "secure",
        "FLOTILLA_FLEET": str(fleet),
        "FLOTILLA_DEVICE": "cpu",
        "FLOTILLA_WORKER_PORT": "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


async def test_requests_are_answered_over_tls_with_a_password(secured: dict[str, str]) -> None:
    settings = Settings()
    assert settings.nats_security.password is not None
    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings.model_dump())
    async with gateway(settings) as client, worker(settings):
        await until_ready(client)  # the worker's liveness, read by the gateway: both secured
        response = await client.post("/v1/embeddings", json={"model": "alpha", "input": "hi"})
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 1


async def test_a_wrong_password_stops_gateway_and_worker_at_start(
    secured: dict[str, str],
) -> None:
    settings = Settings(nats_password=WRONG)
    app = build_gateway_app(settings)
    with pytest.raises(LinkRefused, match="FLOTILLA_NATS_PASSWORD") as refused:
        async with app.router.lifespan_context(app):
            pass
    assert WRONG not in refused.value.message
    with pytest.raises(LinkRefused, match="--nats-user"):
        await run_worker(settings, loader=FakeLoader())


def test_the_gateway_process_exits_naming_the_setting(secured: dict[str, str]) -> None:
    env = {**os.environ, "FLOTILLA_NATS_PASSWORD": WRONG, "FLOTILLA_PORT": str(free_port())}
    done = subprocess.run(
        [sys.executable, "-m", "flotilla", "gateway", "--host", "127.0.0.1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "refused to authorize" in output
    assert "--nats-password (FLOTILLA_NATS_PASSWORD)" in output
    assert WRONG not in output and PASSWORD not in output


async def test_without_the_ca_setting_the_server_is_not_trusted(secured: dict[str, str]) -> None:
    """No TLS setting: the server requires TLS, its certificate is checked against the
    system's CAs, which do not hold the test CA, and the start names the CA setting."""
    settings = Settings(nats_tls_ca=None, nats_user=None, nats_password=None)
    app = build_gateway_app(settings)
    with pytest.raises(LinkRefused, match="--nats-tls-ca"):
        async with app.router.lifespan_context(app):
            pass
