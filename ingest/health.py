"""What the rest of a process may know of its ingest loop: a small protocol and its
value, so the gateway can report ingest in ``/ready`` without importing the Kafka
source or the supervisor (``ingest.supervisor`` implements it); and ``StoreWatch``, by
which the ingest core tells whoever listens that it is waiting on the store."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

# starting: not yet consuming (models loading, joining the group); running: consuming;
# waiting: running, but paused on the store, which is unavailable (last_error says how):
# the chunk in hand is retried, nothing is committed or skipped, and consuming resumes
# by itself once the store answers; restarting: failed, waiting out the backoff before
# the next start; failed: stopped for good (a configuration error, with the reason);
# stopped: shut down on request.
IngestState = Literal["starting", "running", "waiting", "restarting", "failed", "stopped"]


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


class StoreWatch:
    """Whether the store answers ingest: ``down(reason)`` while a store call is being
    retried, ``up()`` once one succeeds. Each listener hears every change (the reason,
    or None when the store is back), so health and metrics follow an outage as it
    happens, not at the next chunk."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._listeners: list[Callable[[str | None], None]] = []

    def listen(self, listener: Callable[[str | None], None]) -> None:
        self._listeners.append(listener)

    def down(self, reason: str) -> None:
        if reason != self.reason:
            self._tell(reason)

    def up(self) -> None:
        if self.reason is not None:
            self._tell(None)

    def _tell(self, reason: str | None) -> None:
        self.reason = reason
        for listener in self._listeners:
            listener(reason)
