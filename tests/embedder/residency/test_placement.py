"""A worker's placement: what it loads for the shared queue's work and what it evicts
(``decide``, pure), and its loop over a real ``Residents`` with fake loads: one load at
a time, advertised at once, none when another worker took the model during the wait,
none without room, and idle models evicted after their time."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Collection, Mapping
from typing import Any

import pytest

from embedder.core.errors import FlotillaError
from embedder.core.jobs import ModelState
from embedder.residency.keeper import FAILED_RETRY_S, Residents
from embedder.residency.placement import ModelView, Placement, decide, hosts_of, wanted

MB = 1 << 20
STATES: tuple[ModelState, ...] = ("ready", "loading", "evicted", "failed")


def view(
    state: ModelState = "evicted",
    waiting: int = 0,
    hosts: int = 0,
    idle_s: float = 0.0,
    fits: bool = True,
) -> ModelView:
    return ModelView(state, waiting, hosts, idle_s, fits)


def test_one_more_host_is_wanted_for_work_with_none_or_too_much_per_host() -> None:
    assert not wanted(view(waiting=0, hosts=0))
    assert wanted(view(waiting=1, hosts=0))
    assert not wanted(view(waiting=16, hosts=1), per_host=16)
    assert wanted(view(waiting=17, hosts=1), per_host=16)
    assert not wanted(view(waiting=32, hosts=2), per_host=16)
    assert wanted(view(waiting=33, hosts=2), per_host=16)


def test_a_model_without_a_host_goes_before_one_with_too_few() -> None:
    views = {
        "crowded": view(waiting=500, hosts=1),
        "orphan": view(waiting=1, hosts=0),
        "orphan-deeper": view(waiting=3, hosts=0),
    }
    assert decide(views, 60.0).load == "orphan-deeper"
    del views["orphan-deeper"], views["orphan"]
    assert decide(views, 60.0).load == "crowded"


@pytest.mark.parametrize(
    ("state", "fits", "waiting", "hosts"),
    list(
        itertools.product(("ready", "loading", "evicted", "failed"), (True, False), (0, 5), (0, 1))
    ),
)
def test_only_an_evicted_model_that_fits_and_is_wanted_loads(
    state: ModelState, fits: bool, waiting: int, hosts: int
) -> None:
    chosen = decide({"m": view(state, waiting, hosts, fits=fits)}, 60.0, per_host=16).load
    assert (chosen == "m") == (state == "evicted" and fits and waiting > 0 and hosts == 0)


def test_idle_resident_models_are_evicted_after_their_time_unless_work_waits() -> None:
    views = {
        "idle": view("ready", idle_s=61.0),
        "recent": view("ready", idle_s=10.0),
        "waited-on": view("ready", waiting=2, idle_s=100.0),
        "never-used": view("ready", idle_s=math.inf),
        "loading": view("loading", idle_s=100.0),
    }
    assert decide(views, 60.0).evict == ("idle", "never-used")
    assert decide(views, 0.0).evict == ("idle", "never-used", "recent")


def test_hosts_count_the_peers_with_it_ready_or_loading() -> None:
    peers = [
        {"a": {"state": "ready"}},
        {"a": {"state": "loading"}, "b": {"state": "evicted"}},
        {"a": {"state": "failed"}},
    ]
    assert hosts_of("a", peers) == 2
    assert hosts_of("b", peers) == 0


# -- the loop -------------------------------------------------------------------------


class FakeMemory:
    def __init__(self) -> None:
        self.held = 0

    def used(self) -> int:
        return self.held

    def release(self) -> None:
        pass

    def settle(self) -> None:
        pass

    def reset_peak(self) -> None:
        pass

    def peak(self) -> int:
        return self.used()


class World:
    """A worker's residents (100 MB models, a budget of 250 MB: two fit), the queue's
    counts and its peers, all set by the test."""

    def __init__(self, names: Collection[str] = ("a", "b", "c")) -> None:
        self.memory = FakeMemory()
        self.now = 1000.0
        self.residents = Residents(250, self.load, self.unload, self.busy, self.refuse)
        self.residents.clock = lambda: self.now
        for name in names:
            self.residents.track(name, pinned=False, on_demand=True, estimate=100 * MB)
        self.residents.attach("cpu", self.memory)
        self.queue: dict[str, int] = {}
        self.peers: list[dict[str, dict[str, Any]]] = []
        self.hand: dict[str, int] = {}
        self.taken: dict[str, float] = {}  # when a pull last took jobs of a model
        self.announced = 0
        self.loaded: list[str] = []
        self.fail: set[str] = set()
        self.refused: list[str] = []

    async def load(self, name: str) -> None:
        if name in self.fail:
            raise RuntimeError("broken weights")
        self.memory.held += 100 * MB
        self.loaded.append(name)

    async def unload(self, name: str) -> None:
        self.memory.held -= 100 * MB

    def busy(self, name: str) -> bool:
        return self.hand.get(name, 0) > 0

    async def refuse(self, name: str, error: FlotillaError) -> None:
        self.refused.append(name)

    async def waiting(self, models: Collection[str]) -> Mapping[str, int]:
        return {m: self.queue.get(m, 0) for m in models}

    async def announce(self) -> None:
        self.announced += 1

    def placement(self, idle_evict_s: float = 60.0) -> Placement:
        return Placement(
            self.residents,
            list(self.residents.records),
            waiting=self.waiting,
            peers=lambda: self.peers,
            in_hand=lambda name: self.hand.get(name, 0),
            taken_at=self.taken.get,
            announce=self.announce,
            idle_evict_s=idle_evict_s,
            jitter_s=0.0,
            rng=random.Random(0),
        )

    def state(self, name: str) -> ModelState:
        return self.residents.records[name].state


async def settle(placement: Placement) -> None:
    if placement._loading is not None:
        await placement._loading


async def test_a_model_with_work_and_no_host_is_loaded_and_said_at_once() -> None:
    world = World()
    placement = world.placement()
    world.queue["b"] = 3
    await placement.step()
    assert world.state("b") == "loading"  # before the load ran: the heartbeat says so
    assert world.announced == 1
    await settle(placement)
    assert world.state("b") == "ready" and world.loaded == ["b"]


async def test_no_load_when_a_peer_hosts_it_or_took_it_during_the_wait() -> None:
    world = World()
    placement = world.placement()
    world.queue["a"] = 3
    world.peers = [{"a": {"state": "loading"}}]
    await placement.step()
    assert world.state("a") == "evicted" and world.announced == 0

    world.peers = []
    original = placement.views

    def taken_meanwhile(waiting: Mapping[str, int], now: float) -> dict[str, ModelView]:
        world.peers = [{"a": {"state": "loading"}}]  # heard during the jitter
        return original(waiting, now)

    placement.views = taken_meanwhile  # type: ignore[method-assign]
    await placement.step()
    assert world.state("a") == "evicted" and world.loaded == []


async def test_a_full_worker_evicts_an_idle_model_but_never_one_in_use() -> None:
    world = World()
    placement = world.placement()
    for name in ("a", "b"):
        world.queue = {name: 1}
        await placement.step()
        await settle(placement)
        world.now += 1
    world.queue = {"c": 5}
    world.hand = {"a": 1, "b": 1}  # both in use: no room, so left to another worker
    await placement.step()
    assert world.state("c") == "evicted"
    world.hand = {"b": 1}
    await placement.step()
    await settle(placement)
    assert {n: world.state(n) for n in "abc"} == {"a": "evicted", "b": "ready", "c": "ready"}
    assert world.refused == []


async def test_idle_models_are_evicted_after_the_idle_time_only() -> None:
    world = World()
    placement = world.placement(idle_evict_s=30.0)
    world.queue = {"a": 2}
    await placement.step()
    await settle(placement)
    world.queue = {}
    world.hand = {"a": 1}
    world.now += 100
    await placement.step()  # in hand: in use now
    assert world.state("a") == "ready"
    world.hand = {}
    world.now += 29
    await placement.step()
    assert world.state("a") == "ready"
    world.now += 2
    await placement.step()
    assert world.state("a") == "evicted"
    assert world.announced == 3  # the load as it starts and as it ends, the eviction


async def test_a_failed_load_answers_nothing_and_is_retried_after_its_time() -> None:
    world = World()
    world.fail = {"a"}
    placement = world.placement()
    world.queue = {"a": 2}
    await placement.step()
    await settle(placement)
    assert world.state("a") == "failed" and world.refused == []
    assert "a" not in world.residents.hostable()  # the heartbeat stops offering it
    await placement.step()
    assert placement._loading is None and world.state("a") == "failed"  # not retried yet
    world.fail = set()
    world.now += FAILED_RETRY_S
    assert "a" in world.residents.hostable()
    await placement.step()
    await settle(placement)
    assert world.state("a") == "ready"


def test_a_model_bigger_than_the_budget_is_not_offered() -> None:
    world = World()
    world.residents.track("huge", pinned=False, on_demand=True, estimate=300 * MB)
    assert world.residents.hostable() == ["a", "b", "c"]


async def test_a_model_whose_jobs_are_answered_between_looks_is_in_use_all_the_same() -> None:
    world = World()
    placement = world.placement(idle_evict_s=30.0)
    world.queue = {"a": 1}
    await placement.step()
    await settle(placement)
    world.queue = {}
    for _ in range(5):  # a request every 20 s, each answered before the next look
        world.now += 20
        world.taken["a"] = world.now - 0.3
        await placement.step()
        assert world.state("a") == "ready"
    world.now += 31
    await placement.step()
    assert world.state("a") == "evicted"
