"""The cache outside the repository where the test services' pinned pieces are built or
fetched once (the Kafka broker's jars, the OCR page set's fonts, helm), and the lock that
makes two checkouts sharing it fetch once instead of racing into one folder."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def cache_root(override: str | None = None) -> Path:
    """``$<override>`` if set, else ``$XDG_CACHE_HOME/flotilla``, else
    ``~/.cache/flotilla``."""
    if override and (root := os.environ.get(override)):
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "flotilla"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (made if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
