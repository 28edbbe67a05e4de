"""What models measured as they loaded on this machine, kept across restarts: a model's
first load in a new process makes room for what it held last time (and its load's peak),
not for what its weight files weigh, and the wait a request is told counts its load time.

One JSON file (``residency.json`` beside the machine's tuned profiles), by device
fingerprint, then by the model's family (the entry's task, source and profiles: entries
alike cost alike, whatever their names). A file that cannot be read is reported once and
replaced by the next measure; it never stops a load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Measure:
    memory_bytes: int  # what the load added
    load_peak_bytes: int  # the most it held at once while loading
    load_s: float


class Measures:
    """One device's measures in the file at ``path``; None keeps nothing (a host built in
    code keeps no file)."""

    def __init__(self, path: Path | None, device: str = "") -> None:
        self.path = path
        self.device = device  # the device's fingerprint
        self._file: dict[str, dict[str, Measure]] = self._read() if path is not None else {}
        self._known = self._file.setdefault(device, {})

    def get(self, family: str) -> Measure | None:
        return self._known.get(_key(family)) if family else None

    def put(self, family: str, measure: Measure) -> None:
        if not family or self.path is None:
            return
        self._known[_key(family)] = measure
        data = {
            device: {key: asdict(m) for key, m in sorted(known.items())}
            for device, known in sorted(self._file.items())
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(data, indent=1), encoding="utf-8")
            partial.replace(self.path)  # whole or not at all, whoever reads it meanwhile
        except OSError as exc:
            log.warning("could not keep the models' measures in %s: %s", self.path, exc)

    def _read(self) -> dict[str, dict[str, Measure]]:
        assert self.path is not None
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return {
                device: {key: Measure(**value) for key, value in known.items()}
                for device, known in raw.items()
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning(
                "the models' measures in %s cannot be read (%s): first loads count by their "
                "weight files; the next measures replace the file",
                self.path, exc,
            )  # fmt: skip
            return {}


def _key(family: str) -> str:
    return hashlib.sha256(family.encode()).hexdigest()[:24]
