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

    @property
    def hosts(self) -> frozenset[str]: ...  # the models it could load on demand

    @property
    def lanes_ms(self) -> tuple[int, ...]: ...  # the deadline lanes it pulls (their bounds)


NO_HOST = "no live worker can host it: bigger than every memory budget, or it failed to load"
SILENT_GRACE_S = 10.0  # longer than a clustered broker takes to elect a new leader


class RemoteWorkers:
    """``ModelStates`` over the workers heard from lately; a transport fills
    ``_workers`` as their word arrives and sets ``_last_word`` to when the latest came.

    A worker is gone once others' word keeps arriving past its expiry. When no word
    arrives from anyone, the channel is the likelier casualty than every worker at once
    (a broker cluster electing the leader of its liveness bucket takes seconds), so the
    workers last heard stay for ``SILENT_GRACE_S`` past their expiry (or past this
    gateway's return from an outage of its own, ``_back_at``), but not while it is cut off
    itself: requests queue for them meanwhile instead of being refused."""

    clock: Callable[[], float]
    _workers: Mapping[str, Sighting]
    _last_word: float = -float("inf")  # on the gateway's clock
    _back_at: float = -float("inf")  # when the transport's connection last came back

    def cut_off(self) -> bool:
        """Whether this gateway itself cannot hear the workers now (its connection to the
        transport is down): then silence says nothing about the channel."""
        return False

    def unheard(self) -> str | None:
        """Why no worker can be heard from now (the transport is cut off), else None: the
        503 for a model no live worker serves says it, and /v1/models beside the model."""
        return None

    def live(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Workers heard from lately that serve this gateway's requests, with their models."""
        return {worker: seen.models for worker, seen in self._live().items()}

    def unusable(self, seen: Sighting) -> str | None:
        """Why this gateway's requests cannot reach a live worker (it reads other
        subjects than this gateway sends to), else None: such a worker does not count."""
        return None

    def _heard(self) -> dict[str, Sighting]:
        now = self.clock()
        return {worker: seen for worker, seen in self._workers.items() if self._alive(seen, now)}

    def _live(self) -> dict[str, Sighting]:
        return {w: seen for w, seen in self._heard().items() if self.unusable(seen) is None}

    def _unreachable(self, model: str) -> str | None:
        """Why the live workers that serve ``model`` cannot take this gateway's requests."""
        for seen in self._heard().values():
            if model in seen.models and (why := self.unusable(seen)) is not None:
                return why
        return None

    @staticmethod
    def key_of(worker_id: str) -> str:
        """The name a worker is known by in ``live()``."""
        return worker_id

    def others(self, worker_id: str) -> list[dict[str, dict[str, Any]]]:
        """The models of the live workers but ``worker_id``: a worker's view of its peers
        (whatever lanes they pull: placement counts every host)."""
        me = self.key_of(worker_id)
        return [seen.models for worker, seen in self._heard().items() if worker != me]

    def placeable(self, model: str) -> int:
        """Live workers that could load ``model`` on demand and have not failed it."""
        return sum(
            1
            for seen in self._live().values()
            if model in seen.hosts and seen.models.get(model, {}).get("state") != "failed"
        )

    def _alive(self, seen: Sighting, now: float) -> bool:
        if seen.expires > now:
            return True
        silent = self._last_word <= seen.expires  # nobody's word since this one expired
        # After an outage longer than the grace, the workers are reconnecting too.
        since = max(seen.expires, self._back_at)
        return silent and not self.cut_off() and now < since + SILENT_GRACE_S

    def state(self, model: str) -> ModelState:
        """'ready' while a live worker serves it; 'evicted' while none does but one could
        load it on demand (its requests queue: a worker's placement takes them); else
        'loading' while one loads it at start, or none is heard of; else 'failed' (no
        live worker can host it: too big for every budget, or failed wherever tried)."""
        states = {m[model].get("state") for m in self.live().values() if model in m}
        if "ready" in states:
            return "ready"
        if self.placeable(model):
            return "evicted"
        if "loading" in states or not states:
            return "loading"
        return "failed"

    def describe(self, model: str) -> dict[str, object]:
        serving = [
            m[model] for m in self.live().values() if m.get(model, {}).get("state") == "ready"
        ]
        if not serving:
            why = self.unheard() or self._unreachable(model)
            if why is None and self.state(model) == "failed":
                why = NO_HOST
            hosts = {"hosts": n} if (n := self.placeable(model)) else {}
            return {"workers": 0, "reason": why, **hosts} if why else {"workers": 0, **hosts}
        info = {k: v for k, v in serving[0].items() if k != "state"}
        return {**info, "workers": len(serving)}
