"""``--fleet-state FILE``: the models added and removed through the admin API, kept so
that they survive a restart of ``flotilla serve``.

The file holds what differs from the fleet file (``--fleet``), not a copy of it::

    added:                      # entries added while serving, as the fleet file has them
      legal-embed: {source: {path: /models/legal-embed}, max_tokens: 512}
    removed: [all-minilm-l6-v2]  # models of the fleet file taken out

so an edit of the fleet file still reaches every model the admin API left alone. A
model of the fleet file that was removed and then added again is in both: its added
entry replaces the fleet file's. ``FleetStateFile`` reads it at start (a missing file is
no change; a malformed one stops the start, naming the file) and applies it over the
fleet file; ``KeptFleetChanges`` wraps the model host's ``FleetAdmin`` and writes the
file after each change that succeeded: whole, into a temporary file renamed over the
old, so a crash leaves the old file or the new one, never part of one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from embedder.core.fleet import Fleet, FleetAdmin, FleetError, ModelSpec
from embedder.tasks.fleet import parse_entry

log = logging.getLogger(__name__)

HEADER = (
    "# The models added and removed while serving (flotilla serve --fleet-state), applied\n"
    "# over the fleet file at start. Written by the server after each change.\n"
)


class FleetStateError(FleetError):
    """The fleet-state file cannot be read, is malformed, or could not be written."""

    code = "fleet_state_error"
    param_hint = "'--fleet-state' / FLOTILLA_FLEET_STATE"  # the setting to look at


@dataclass(frozen=True, slots=True)
class FleetState:
    """What the admin API changed: entries added (name -> entry, as the fleet file holds
    it), and the names of the fleet file's models taken out."""

    added: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    removed: tuple[str, ...] = ()

    def with_added(self, name: str, entry: Mapping[str, Any]) -> FleetState:
        return FleetState({**self.added, name: entry}, self.removed)

    def with_removed(self, name: str, *, configured: bool) -> FleetState:
        """``name`` gone; a model of the fleet file is recorded as removed, one that was
        only ever added is simply forgotten."""
        added = {n: e for n, e in self.added.items() if n != name}
        keep = configured and name not in self.removed
        return FleetState(added, (*self.removed, name) if keep else self.removed)

    def as_data(self) -> dict[str, Any]:
        return {"added": {n: dict(e) for n, e in self.added.items()}, "removed": list(self.removed)}


def parse_state(raw: Any) -> FleetState:
    """The file's data as a FleetState; ValueError says what is wrong with its shape."""
    if raw is None:  # an empty file
        return FleetState()
    if not isinstance(raw, dict) or set(raw) - {"added", "removed"}:
        raise ValueError("it must be a mapping with 'added' and 'removed', nothing else")
    added = raw.get("added") or {}
    if not isinstance(added, dict) or not all(
        isinstance(name, str) and isinstance(entry, dict) for name, entry in added.items()
    ):
        raise ValueError("'added' must map each model's name to its entry")
    removed = raw.get("removed") or []
    if not isinstance(removed, list) or not all(isinstance(name, str) for name in removed):
        raise ValueError("'removed' must be a list of model names")
    return FleetState(added, tuple(dict.fromkeys(removed)))


def read_state(path: Path) -> FleetState:
    """The state kept in ``path``; none kept yet when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return FleetState()
    except OSError as exc:
        raise FleetStateError(f"cannot read fleet-state file {path}: {exc}") from exc
    try:
        return parse_state(yaml.safe_load(text))
    except yaml.YAMLError as exc:
        raise FleetStateError(f"fleet-state file {path} is not valid YAML: {exc}") from exc
    except ValueError as exc:
        raise FleetStateError(f"fleet-state file {path} is malformed: {exc}") from exc


def write_state(path: Path, state: FleetState) -> None:
    """``state`` into ``path`` atomically: a temporary file beside it, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(HEADER + yaml.safe_dump(state.as_data(), sort_keys=False))
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename makes it the file
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def entry_of(spec: ModelSpec) -> dict[str, Any]:
    """The entry as it was given (fields left to their defaults stay out), so a default
    changed by a later release reaches a kept model too."""
    return spec.model_dump(mode="json", exclude_unset=True, exclude={"name"})


class FleetStateFile:
    """The file of ``--fleet-state``: read when made, applied over the fleet file at start
    (``apply``), written after each change (``added``, ``removed``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state = read_state(path)
        self.configured: frozenset[str] = frozenset()  # the fleet file's models
        self._writing = asyncio.Lock()  # one write at a time, each of the latest state

    def apply(self, fleet: Fleet) -> Fleet:
        """The fleet file's ``fleet`` with the kept changes: its removed models out, the
        added entries in (replacing the fleet file's entry of the same name)."""
        self.configured = frozenset(fleet.models)
        for name in set(self.state.removed) - self.configured:
            log.info("%s: %r is removed, and no longer in the fleet file", self.path, name)
        models = {
            name: spec
            for name, spec in fleet.models.items()
            if name not in self.state.removed and name not in self.state.added
        }
        try:
            models |= {name: parse_entry(name, e) for name, e in self.state.added.items()}
            if not models:
                raise ValueError("it removes every model; a fleet needs one")
            return Fleet.model_validate({"models": models})
        except ValueError as exc:  # pydantic's ValidationError included
            raise FleetStateError(
                f"fleet-state file {self.path} does not apply over the fleet: {exc}"
            ) from exc

    async def added(self, name: str, entry: Mapping[str, Any]) -> None:
        self.state = self.state.with_added(name, entry)
        await self._write(f"model {name!r} was added")

    async def removed(self, name: str) -> None:
        self.state = self.state.with_removed(name, configured=name in self.configured)
        await self._write(f"model {name!r} was removed")

    async def _write(self, change: str) -> None:
        async with self._writing:
            try:
                await asyncio.to_thread(write_state, self.path, self.state)
            except OSError as exc:
                raise FleetStateError(
                    f"{change}, but writing {self.path} failed ({exc}): the change lasts "
                    "until the server stops"
                ) from exc


class KeptFleetChanges:
    """A ``FleetAdmin`` over another (the model host) that writes each change that
    succeeded to the fleet-state file, if there is one; ``prepare`` makes an added
    entry ready for the host as the fleet file's are (imports under --model-cache-dir),
    while the file keeps it as given. Changes to one name run one at a time, so the
    file records them in the order they took effect."""

    def __init__(
        self,
        admin: FleetAdmin,
        kept: FleetStateFile | None,
        prepare: Callable[[ModelSpec], ModelSpec] = lambda spec: spec,
    ) -> None:
        self.admin = admin
        self.kept = kept
        self.prepare = prepare
        self._names: dict[str, asyncio.Lock] = {}

    @property
    def kept_in(self) -> Path | None:
        return None if self.kept is None else self.kept.path

    async def add_model(self, spec: ModelSpec) -> None:
        async with self._names.setdefault(spec.name, asyncio.Lock()):
            await self.admin.add_model(self.prepare(spec))
            if self.kept is not None:
                await self.kept.added(spec.name, entry_of(spec))

    async def remove_model(self, name: str) -> None:
        async with self._names.setdefault(name, asyncio.Lock()):
            await self.admin.remove_model(name)
            if self.kept is not None:
                await self.kept.removed(name)
