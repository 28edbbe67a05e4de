"""What a gateway knows of workers in other processes: each one's models and their
states, until its word expires. The JetStream liveness bucket feeds it; a substrate
added later answers ``ModelStates`` alike by filling the same view."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from embedder.core.jobs import ModelState


class Sighting(Protocol):
    @property
    def expires(self) -> float: ...  # on the gateway's own clock

    @property
    def models(self) -> dict[str, dict[str, Any]]: ...  # model -> its state and info


class RemoteWorkers:
    """``ModelStates`` over the workers heard from lately; a transport fills
    ``_workers`` as their word arrives."""

    clock: Callable[[], float]
    _workers: Mapping[str, Sighting]

    def unheard(self) -> str | None:
        """Why no worker can be heard from now (the transport is cut off), else None: the
        503 for a model no live worker serves says it, and /v1/models beside the model."""
        return None

    def live(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Workers heard from lately, with their models."""
        now = self.clock()
        return {worker: seen.models for worker, seen in self._workers.items() if seen.expires > now}

    def state(self, model: str) -> ModelState:
        states = {m[model].get("state") for m in self.live().values() if model in m}
        if "ready" in states:
            return "ready"
        if "loading" in states or not states:
            return "loading"
        return "failed"

    def describe(self, model: str) -> dict[str, object]:
        serving = [
            m[model] for m in self.live().values() if m.get(model, {}).get("state") == "ready"
        ]
        if not serving:
            why = self.unheard()
            return {"workers": 0, "reason": why} if why else {"workers": 0}
        info = {k: v for k, v in serving[0].items() if k != "state"}
        return {**info, "workers": len(serving)}
