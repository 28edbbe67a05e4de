"""The served side of ``bench.ocr``: ``flotilla serve`` with one OCR fleet entry,
measured through ``POST /v1/ocr``.

The entry is ``--flotilla-model`` or, without it, the fleet's first entry with
task ``ocr`` (in the bundled fleet, or the one ``--flotilla-fleet`` names).
The server loads only that entry (a one-model fleet file written beside its
log, as ``bench.generation.flotilla_side`` does), so no other model delays
``/ready`` or shares the CPU. A fleet without such an entry skips the side
with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.generation.flotilla_side import SkipSide
from bench.load import HOST, free_port

OCR_TASK = "ocr"
ROUTE = "/v1/ocr"


@dataclass(frozen=True)
class FlotillaSide:
    model: str | None  # the fleet entry; None: the fleet's first OCR entry
    fleet: Path | None  # None: the bundled fleet
    threads: int
    ready_timeout_s: float


@dataclass(frozen=True)
class Served:
    url: str  # .../v1/ocr
    model: str
    pid: int


def fleet_file(side: FlotillaSide, path: Path) -> str:
    """Write the one-model fleet to ``path``; its model's name. SkipSide with the
    reason when the fleet has no such OCR entry."""
    from embedder.core.errors import FlotillaError
    from embedder.tasks.fleet import load_fleet

    try:
        fleet = load_fleet(side.fleet)
        if side.model is not None:
            spec = fleet.get(side.model)
        else:
            found = [s for s in fleet.models.values() if str(s.task) == OCR_TASK]
            if not found:
                where = side.fleet or "the bundled fleet"
                raise SkipSide(f"{where} has no entry with task {OCR_TASK}")
            spec = found[0]
    except FlotillaError as exc:
        raise SkipSide(str(exc)) from exc
    if str(spec.task) != OCR_TASK:
        raise SkipSide(f"fleet entry {spec.name!r} has task {spec.task!s}, not {OCR_TASK}")
    models = {spec.name: spec.model_dump(mode="json", exclude={"name"}, exclude_unset=True)}
    path.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
    return spec.name


@contextlib.contextmanager
def serve(side: FlotillaSide, log_path: Path) -> Iterator[Served]:
    """``flotilla serve`` on a free port (CPU) once ``/ready`` answers; stopped on exit."""
    from bench.served import server

    fleet_path = log_path.with_name(log_path.stem + "-fleet.yaml")
    model = fleet_file(side, fleet_path)
    port = free_port()
    with server(port, side.threads, log_path, side.ready_timeout_s, fleet_path, "cpu") as pid:
        yield Served(f"http://{HOST}:{port}{ROUTE}", model, pid)
