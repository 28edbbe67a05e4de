"""The flotilla side of ``bench.generate``: ``flotilla serve`` with one
generation model of a fleet, measured through its ``/v1/chat/completions``.

The model is a fleet entry named by ``--flotilla-model`` (in the bundled
fleet, or the one ``--flotilla-fleet`` names). The server loads only that
entry (a one-model fleet file, as ``bench.served`` writes), so its other
models neither delay ``/ready`` nor share the CPU. A name the fleet lacks, or
an entry whose task is not ``generate``, skips the side with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.generation.load import Target
from bench.load import HOST, free_port

GENERATE_TASK = "generate"


@dataclass(frozen=True)
class FlotillaSide:
    model: str | None  # the fleet entry; None: not asked for
    fleet: Path | None  # None: the bundled fleet
    threads: int
    ready_timeout_s: float
    timeout_s: float  # a request's, as the client waits for it


def fleet_file(side: FlotillaSide, path: Path) -> str | None:
    """Write the one-model fleet to ``path``; the reason to skip instead, or None."""
    if side.model is None:
        return "no --flotilla-model given (a fleet entry with task: generate)"
    from embedder.core.errors import FlotillaError
    from embedder.tasks.fleet import load_fleet

    try:
        fleet = load_fleet(side.fleet)
        spec = fleet.get(side.model)
    except FlotillaError as exc:
        return str(exc)
    if str(spec.task) != GENERATE_TASK:
        return f"fleet entry {spec.name!r} has task {spec.task!s}, not {GENERATE_TASK}"
    models = {spec.name: spec.model_dump(mode="json", exclude={"name"}, exclude_unset=True)}
    path.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
    return None


@contextlib.contextmanager
def serve(side: FlotillaSide, log_path: Path) -> Iterator[tuple[Target, int]]:
    """``flotilla serve`` on a free port with the fleet file written beside the log;
    yields the route and the server's pid once ``/ready`` answers, stops it on exit."""
    from bench.served import server

    fleet_path = log_path.with_name(log_path.stem + "-fleet.yaml")
    why = fleet_file(side, fleet_path)
    if why is not None:
        raise SkipSide(why)
    assert side.model is not None
    port = free_port()
    # A request's deadline as long as the client waits: the default (30 s) would drop
    # answers that the baselines, which have no deadline, give at 32 clients.
    deadline = {"FLOTILLA_REQUEST_TIMEOUT_S": str(side.timeout_s)}
    with server(
        port, side.threads, log_path, side.ready_timeout_s, fleet_path, "cpu", deadline
    ) as pid:
        yield Target("flotilla", f"http://{HOST}:{port}/v1/chat/completions", side.model), pid


class SkipSide(Exception):
    """A side that cannot run here; its message says why."""
