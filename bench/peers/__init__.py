"""Other embedding servers measured beside flotilla in ``bench.served``.

A peer runs from its own virtualenv outside the repository (its pins clash
with flotilla's), installed by its script here (``bench/peers/NAME.sh``). The
registry maps a name to the module that starts it; a peer whose venv is
missing is skipped with a line saying how to install it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class PeerConfig:
    """One configuration of a peer server: a name for the rows, and its knobs."""

    name: str  # e.g. "bs32-bfloat16"
    batch_size: int
    dtype: str


@dataclass(frozen=True)
class Start:
    """How to start a peer: the configuration, the model, where, and how long to wait."""

    config: PeerConfig
    model_dir: Path  # the same local folder flotilla serves
    model_name: str  # the name requests carry (the fleet's)
    port: int
    threads: int
    device: str  # "cpu" or "cuda"
    log_path: Path
    ready_timeout_s: float


@dataclass(frozen=True)
class Launch:
    """What a started peer needs to be measured: where to send requests."""

    url: str  # the OpenAI-compatible embeddings route
    model: str  # the "model" field its requests carry
    pid: int


class Peer(Protocol):
    name: str
    version: str

    def missing(self) -> str | None:
        """None when installed, else a line saying how to install it."""
        ...

    def serve(self, start: Start) -> AbstractContextManager[Launch]:
        """Start the server, yield once it answers, stop it on exit."""
        ...


# name -> "module:attribute"; imported when asked for.
PEERS: dict[str, str] = {
    "infinity": "bench.peers.infinity:PEER",
}


def peers_dir() -> Path:
    """Where peer venvs live: $FLOTILLA_PEERS_DIR, else ~/.cache/flotilla/peers."""
    configured = os.environ.get("FLOTILLA_PEERS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "flotilla" / "peers"


def get_peer(name: str) -> Peer:
    try:
        target = PEERS[name]
    except KeyError:
        raise SystemExit(f"unknown peer {name!r}; known: {', '.join(PEERS)}") from None
    module_name, _, attr = target.partition(":")
    peer: Peer = getattr(importlib.import_module(module_name), attr)
    return peer


def installed_peers() -> Iterator[tuple[str, str | None]]:
    """(name, why it is missing or None) for every registered peer."""
    for name in PEERS:
        yield name, get_peer(name).missing()
