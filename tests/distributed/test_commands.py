"""`flotilla gateway` and `flotilla worker`: their flags and settings, the refusal without
--nats, and imports that keep torch out of the gateway."""

from __future__ import annotations

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

import flotilla.cli
import flotilla.distributed
from flotilla.cli import app
from flotilla.distributed import reply_topic
from flotilla.settings import Settings, setting_fields
from tests.gateway.test_no_torch import heavy_modules_after

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Settings]]:
    """The commands record what they would run, instead of running it."""
    calls: list[tuple[str, Settings]] = []
    # The worker command makes SIGTERM a clean exit until it runs; not in this process.
    monkeypatch.setattr(flotilla.cli, "exit_cleanly_until_running", lambda: None)
    monkeypatch.setattr(flotilla.distributed, "serve_gateway", lambda s: calls.append(("gw", s)))
    monkeypatch.setattr(flotilla.distributed, "serve_worker", lambda s: calls.append(("wk", s)))
    return calls


@pytest.mark.parametrize("command", ["gateway", "worker"])
def test_every_setting_is_a_flag(command: str) -> None:
    """Accepted, so that one list of flags starts both; --help lists the ones the command
    reads (tests/flotilla/test_cli_settings.py)."""
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    accepted = {opt for param in root.commands[command].params for opt in param.opts}
    for name in setting_fields(Settings):
        assert f"--{name.replace('_', '-')}" in accepted, name


@pytest.mark.parametrize("command", ["gateway", "worker"])
def test_refused_without_nats(command: str, started: list[tuple[str, Settings]]) -> None:
    result = CliRunner().invoke(app, [command])
    assert result.exit_code == 2
    assert "--nats" in result.output
    assert started == []


@pytest.mark.parametrize("command", ["gateway", "worker"])
def test_kafka_alone_carries_no_requests(command: str, started: list[tuple[str, Settings]]) -> None:
    """--kafka is the documents' stream; the requests need JetStream, and the refusal says so."""
    result = CliRunner().invoke(app, [command, "--kafka", "k:9092"])
    assert result.exit_code == 2
    assert "--nats" in result.output
    assert started == []


def test_flags_and_environment_reach_the_commands(started: list[tuple[str, Settings]]) -> None:
    env = {"FLOTILLA_NATS": "nats://n1:4222", "FLOTILLA_NATS_STREAM": "GPU_JOBS"}
    flags = ["--nats-ack-wait-s", "30", "--nats-max-deliver", "3", "--gateway-id", "gw-a"]
    assert CliRunner().invoke(app, ["gateway", *flags], env=env).exit_code == 0
    assert CliRunner().invoke(app, ["worker", "--nats", "nats://n2:4222"], env=env).exit_code == 0
    (_, gw), (_, wk) = started
    assert (gw.nats, gw.jetstream.ack_wait_s, gw.jetstream.max_deliver) == (
        "nats://n1:4222",
        30.0,
        3,
    )
    assert reply_topic(gw) == "flotilla.replies.gw-a"
    assert (wk.nats, wk.jetstream.stream, wk.jetstream.subject_prefix) == (
        "nats://n2:4222",
        "GPU_JOBS",
        "flotilla.jobs",
    )


def test_a_worker_that_ingests_needs_the_broker_and_a_valid_collection(
    started: list[tuple[str, Settings]],
) -> None:
    nats = ["worker", "--nats", "nats://n:4222"]
    result = CliRunner().invoke(app, [*nats, "--topic", "docs"])
    assert result.exit_code == 2 and "--kafka BOOTSTRAP" in result.output, result.output
    result = CliRunner().invoke(app, [*nats, "--kafka", "k:9092", "--topic", "docs",
                                      "--collection", "no spaces"])  # fmt: skip
    assert result.exit_code == 2 and "--collection" in result.output, result.output
    assert started == []
    flags = [*nats, "--kafka", "k:9092", "--topic", "docs", "--group", "g1"]
    assert CliRunner().invoke(app, flags).exit_code == 0
    ((_, wk),) = started
    ingest = wk.ingest
    assert (wk.nats, ingest.bootstrap, ingest.topic, ingest.group) == (
        "nats://n:4222",
        "k:9092",
        "docs",
        "g1",
    )


def test_the_reply_inbox_defaults_to_host_and_port_in_subject_characters() -> None:
    inbox = reply_topic(Settings(gateway_id="pod/7 ä", port=9000))
    assert inbox == "flotilla.replies.pod-7--"
    assert reply_topic(Settings(port=9001)).endswith("-9001")


def test_the_distributed_gateway_imports_leave_torch_out() -> None:
    modules = (
        "flotilla.distributed",
        "embedder.queue.jetstream.submitter",
        "embedder.queue.jetstream.puller",
        "embedder.queue.jetstream.liveness",
    )
    assert heavy_modules_after(*modules) == []
