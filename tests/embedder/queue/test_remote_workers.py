"""The gateway's view of workers in other processes: a worker is gone once others keep
being heard past its expiry; when nobody is heard, the channel is suspected, not every
worker, for a bounded grace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from embedder.queue.remote_workers import NO_HOST, SILENT_GRACE_S, RemoteWorkers

TTL_S = 3.0


@dataclass
class Seen:
    expires: float
    models: dict[str, dict[str, Any]] = field(default_factory=lambda: {"alpha": {"state": "ready"}})
    hosts: frozenset[str] = frozenset()
    lanes_ms: tuple[int, ...] = ()


class View(RemoteWorkers):
    def __init__(self) -> None:
        self.now = 0.0
        self.clock = lambda: self.now
        self._workers: dict[str, Seen] = {}
        self.cut = False

    def cut_off(self) -> bool:
        return self.cut

    def hear(self, worker: str) -> None:
        self._workers[worker] = Seen(self.now + TTL_S)
        self._last_word = self.now


def test_a_silent_worker_is_gone_once_the_others_are_heard_past_its_expiry() -> None:
    view = View()
    view.hear("a")
    for beat in (0.0, 1.0, 2.0, 3.0, 3.5):
        view.now = beat
        view.hear("b")
    view.now = 3.6
    assert set(view.live()) == {"b"}
    assert view.state("alpha") == "ready"


def test_when_nobody_is_heard_the_workers_stay_for_the_grace_then_go() -> None:
    view = View()
    view.hear("a")
    view.hear("b")
    view.now = TTL_S + SILENT_GRACE_S - 0.1  # a broker electing its leader: nothing arrives
    assert set(view.live()) == {"a", "b"}
    view.now = TTL_S + SILENT_GRACE_S + 0.1
    assert view.live() == {}
    assert view.state("alpha") == "loading"  # the gateway answers 503 again


def test_cut_off_the_view_is_empty_and_back_the_workers_last_heard_get_the_grace() -> None:
    view = View()
    view.hear("a")
    view.cut = True  # the gateway's own connection is down: silence says nothing
    view.now = TTL_S + 0.1
    assert view.live() == {}
    view.now = 20.0  # back after an outage longer than the grace
    view.cut = False
    view._back_at = view.now
    assert set(view.live()) == {"a"}  # reconnecting too: requests queue meanwhile
    view.now = 20.0 + SILENT_GRACE_S + 0.1
    assert view.live() == {}


def test_a_model_a_live_worker_can_load_on_demand_is_evicted_and_queued_not_refused() -> None:
    view = View()
    # "a" could load beta (it fits its budget); "b" holds alpha and has no room for beta
    view._workers["a"] = Seen(TTL_S, {"beta": {"state": "evicted"}}, frozenset({"beta"}))
    view._workers["b"] = Seen(TTL_S, {"beta": {"state": "evicted"}})
    view._last_word = 0.0
    assert view.state("beta") == "evicted"  # the gateway queues it; "a" will load it
    assert view.describe("beta") == {"workers": 0, "hosts": 1}
    view._workers["a"].models["beta"] = {"state": "loading"}
    assert view.state("beta") == "evicted"  # still queued while it loads on demand
    view._workers["a"].models["beta"] = {"state": "ready"}
    assert view.state("beta") == "ready"


def test_a_model_no_live_worker_can_host_is_failed_with_the_reason() -> None:
    view = View()
    view._workers["a"] = Seen(TTL_S, {"huge": {"state": "evicted"}}, frozenset({"small"}))
    view._workers["b"] = Seen(TTL_S, {"huge": {"state": "failed"}}, frozenset({"huge"}))
    view._last_word = 0.0
    assert view.state("huge") == "failed"  # too big for "a", failed on "b": 503 at once
    assert view.describe("huge") == {"workers": 0, "reason": NO_HOST}
