"""Who owns an embedded collection, for the process that finds it locked.

The engine's lock on a shard's WAL says only that someone holds it. The holder writes
``<collection>/owner.json`` once it has the lock (its pid, command line, and the URL it
serves, when it is a server), so the error a second opener gets names the owner and the
ways in that work while it runs, with the owner's own URL where it has one.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

OWNER = "owner.json"


def write_owner(folder: Path, serving_url: str | None) -> None:
    """Say who holds the shard, for the next process that finds it locked. Written once the
    lock is held, so whoever reads it while the lock is held reads the holder's."""
    owner = {"pid": os.getpid(), "argv": sys.argv, "url": serving_url, "since": time.time()}
    path = folder / OWNER
    tmp = folder / f".{OWNER}.{os.getpid()}.{uuid.uuid4().hex}"
    try:
        tmp.write_text(json.dumps(owner) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # only a courtesy to the next opener: never fail an open over it
        tmp.unlink(missing_ok=True)


def read_owner(folder: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads((folder / OWNER).read_text(encoding="utf-8"))
        pid = int(owner["pid"])
        if pid != os.getpid():
            os.kill(pid, 0)  # a stale file of a process gone names nobody
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return dict(owner)


def owned_message(collection: str, root: Path, owner: dict[str, Any] | None) -> str:
    url = owner.get("url") if owner else None
    if owner is None:
        who = "another process"
    elif owner["pid"] == os.getpid():
        who = "another store in this process"
    else:
        command = _command(owner.get("argv") or ["?"])
        who = f"process {owner['pid']} ({command})" + (f", serving {url}" if url else "")
    return (
        f"collection {collection!r} under {root} is owned by {who}: an embedded collection "
        "has one owner, and only the owner reads and writes it. To add documents while it "
        f"runs, send them to the owner: `flotilla ingest --from FILE --server {url or 'URL'}"
        f" --collection {collection}` (its POST /v1/collections/{collection}/documents "
        "route), or let the server ingest Kafka itself (`flotilla serve --kafka BOOTSTRAP "
        "--topic TOPIC`); to share collections between processes, use a Qdrant server "
        "(`--store qdrant --qdrant-url URL`)."
    )


def _command(argv: list[str]) -> str:
    """A command line as its user typed it: ``flotilla serve ...``, not the script's path."""
    program = Path(str(argv[0]))
    name = program.parent.name if program.name == "__main__.py" else program.name
    return " ".join([name, *map(str, argv[1:])])[:200]
