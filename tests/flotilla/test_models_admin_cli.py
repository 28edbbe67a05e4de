"""`flotilla models add|remove|list --server URL` against a server's admin API (the app
of tests.gateway.fake_admin behind uvicorn, in a thread): changes made and said where
they are kept, each refusal printed with the server's reason and exit status 1."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
import yaml
from fastapi import FastAPI
from typer.testing import CliRunner, Result

from flotilla.cli import app
from flotilla.fleet_state import FleetStateFile, KeptFleetChanges, read_state
from tests.gateway.conftest import _free_port
from tests.gateway.fake_admin import ADMIN_KEY, CLIENT_KEY, SOURCE, admin_app, two_models

pytestmark = pytest.mark.usefixtures("clean_env")


@contextlib.contextmanager
def serving(application: FastAPI) -> Iterator[str]:
    port = _free_port()
    config = uvicorn.Config(application, host="127.0.0.1", port=port, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "fleet-state.yaml"


@pytest.fixture
def server(state: Path) -> Iterator[str]:
    kept = FleetStateFile(state)
    kept.apply(two_models())  # as at start: what the fleet file holds
    application, _ = admin_app(wrap=lambda host: KeptFleetChanges(host, kept))
    with serving(application) as url:
        yield url


def flotilla(*args: str, key: str | None = ADMIN_KEY, env: dict[str, str] | None = None) -> Result:
    keys = [] if key is None else ["--admin-keys", key]
    return CliRunner().invoke(app, ["models", *args, *keys], env=env)


def entries_file(folder: Path, entries: dict[str, object]) -> Path:
    path = folder / "models.yaml"
    path.write_text(yaml.safe_dump(entries, sort_keys=False), encoding="utf-8")
    return path


def test_add_list_and_remove_on_a_server(tmp_path: Path, server: str, state: Path) -> None:
    added = entries_file(
        tmp_path,
        {
            "legal": {"source": SOURCE, "adapters": {"gesetze": "adapters/gesetze"}},
            "reader": {"source": SOURCE, "task": "rerank", "load": "on_demand"},
        },
    )
    result = flotilla("add", str(added), "--server", server)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"added legal (kept in {state})",
        f"added reader (kept in {state})",
    ]
    # A relative adapter folder is read beside the file, as in the fleet file.
    kept = read_state(state).added
    assert kept["legal"]["adapters"] == {"gesetze": str(tmp_path / "adapters" / "gesetze")}

    listed = flotilla("list", "--server", server)
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines() == [
        "alpha\tembed\tready\tstart, pinned\tpath:/models/weights",
        "judge\trerank\tready\ton_demand\tpath:/models/weights",
        "legal\tembed\tready\tstart, pinned\tpath:/models/weights",
        "reader\trerank\tready\ton_demand\tpath:/models/weights",
        f"changes made while serving: kept in {state}",
    ]
    as_json = json.loads(flotilla("list", "--server", server, "--json").output)
    assert [m["name"] for m in as_json["data"]] == ["alpha", "judge", "legal", "reader"]

    removed = flotilla("remove", "legal", "--server", server)
    assert removed.exit_code == 0, removed.output
    assert removed.output == f"removed legal (kept in {state})\n"
    removed = flotilla("remove", "judge", "--server", server + "/")
    assert removed.exit_code == 0, removed.output
    assert read_state(state).added.keys() == {"reader"}
    assert read_state(state).removed == ("judge",)


def test_a_refused_entry_is_printed_and_what_came_before_stays(tmp_path: Path, server: str) -> None:
    added = entries_file(
        tmp_path,
        {"fine": {"source": SOURCE}, "broken": {"source": SOURCE, "max_tokens": -1}},
    )
    result = flotilla("add", str(added), "--server", server)
    assert result.exit_code == 1
    assert "added fine (kept in" in result.stdout
    assert "answered 422: model 'broken': max_tokens: Input should be greater than 0" in (
        result.stderr
    )
    assert "(added before the error: fine)" in result.stderr
    again = flotilla("add", str(added), "--server", server)
    assert "answered 409: 'fine' is taken by model 'fine'" in again.stderr


@pytest.mark.parametrize(
    ("key", "env"),
    [(None, None), (CLIENT_KEY, None), (None, {"FLOTILLA_API_KEYS": CLIENT_KEY})],
    ids=["no key", "a client key", "the client keys"],
)
def test_without_an_admin_key_the_server_refuses_and_says_which_key(
    server: str, key: str | None, env: dict[str, str] | None
) -> None:
    result = flotilla("list", "--server", server, key=key, env=env)
    assert result.exit_code == 1
    assert "answered 401: missing or unknown admin key" in result.stderr
    assert "--admin-keys (FLOTILLA_ADMIN_KEYS)" in result.stderr


def test_the_key_flag_wins_over_the_variable(server: str) -> None:
    result = flotilla("list", "--server", server, env={"FLOTILLA_ADMIN_KEYS": "stale"})
    assert result.exit_code == 0, result.output
    from_env = flotilla(
        "list", "--server", server, key=None, env={"FLOTILLA_ADMIN_KEYS": ADMIN_KEY}
    )
    assert from_env.exit_code == 0, from_env.output


def test_an_unknown_model_and_an_off_admin_api_print_the_server_s_reason(
    server: str,
) -> None:
    result = flotilla("remove", "nothing", "--server", server)
    assert result.exit_code == 1
    assert "answered 404: model 'nothing' is not in the fleet" in result.stderr
    application, _ = admin_app(admin_keys=())
    with serving(application) as off:
        result = flotilla("list", "--server", off)
    assert result.exit_code == 1
    assert "the admin API is off: start the server with --admin-keys" in result.stderr


def test_no_server_there_is_said_plainly() -> None:
    result = flotilla("list", "--server", f"http://127.0.0.1:{_free_port()}")
    assert result.exit_code == 1
    assert "cannot reach http://127.0.0.1:" in result.stderr
    assert "is `flotilla serve` running there?" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list"], "Missing option '--server'"),
        (["list", "--server", "localhost:8000"], "is not a server URL"),
        (["add", "missing.yaml", "--server", "http://h"], "does not exist"),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    result = flotilla(*args)
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [("[a, b]", "must map each model's name to its entry"), ("x: 3", "an entry is a mapping")],
)
def test_a_file_that_is_no_entries_is_refused_before_calling(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(text, encoding="utf-8")
    result = flotilla("add", str(path), "--server", f"http://127.0.0.1:{_free_port()}")
    assert result.exit_code == 1
    assert message in result.stderr
