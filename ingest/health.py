"""What the rest of a process may know of its ingest loop: a small protocol and its
value, so the gateway can report ingest in ``/ready`` without importing the Kafka
source or the supervisor (``ingest.supervisor`` implements it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

# starting: not yet consuming (models loading, joining the group); running: consuming;
# restarting: failed, waiting out the backoff before the next start; failed: stopped for
# good (a configuration error, with the reason); stopped: shut down on request.
IngestState = Literal["starting", "running", "restarting", "failed", "stopped"]


@dataclass(frozen=True, slots=True)
class IngestStatus:
    state: IngestState
    topic: str
    restarts: int = 0
    last_error: str | None = None  # why the last run failed, until one runs again

    @property
    def up(self) -> bool:
        return self.state == "running"

    def describe(self) -> dict[str, object]:
        return {
            "state": self.state,
            "topic": self.topic,
            "restarts": self.restarts,
            "last_error": self.last_error,
        }


class IngestHealth(Protocol):
    def status(self) -> IngestStatus: ...
