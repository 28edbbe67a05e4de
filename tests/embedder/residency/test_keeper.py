"""The keeper alone, over fake loads and a fake device: a model that turns out too big for
the room left waits for a busy model to fall idle rather than failing, a model's measure
is its family's estimate, the wait a request is told counts the load ahead of it, and
memory that evictions leave behind counts against the budget while a runtime's
libraries do not."""

from __future__ import annotations

import asyncio
import time

from embedder.core.errors import FlotillaError, NoRoom
from embedder.residency.keeper import Residents
from tests.embedder.tasks.embed.test_worker import until

MB = 1 << 20


class FakeDevice:
    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        self.kept = 0  # MB that unloads left behind (a runtime's cache, the heap's holes)
        self.libraries = 0  # MB that ``prepare`` imported
        self.loaded: set[str] = set()
        self.busy: set[str] = set()
        self.refused: list[tuple[str, FlotillaError]] = []

    def used(self) -> int:
        return (sum(self.sizes[name] for name in self.loaded) + self.kept + self.libraries) * MB

    def release(self) -> None:
        pass

    def settle(self) -> None:
        pass

    def reset_peak(self) -> None:
        pass

    def peak(self) -> int:
        return self.used()

    async def load(self, name: str) -> None:
        await asyncio.sleep(0.01)
        self.loaded.add(name)

    async def unload(self, name: str) -> None:
        self.loaded.discard(name)

    async def refuse(self, name: str, error: FlotillaError) -> None:
        self.refused.append((name, error))


def residents_of(device: FakeDevice, budget_mb: float) -> Residents:
    residents = Residents(
        budget_mb, device.load, device.unload, lambda name: name in device.busy, device.refuse
    )
    residents.attach("cpu", device)
    return residents


async def test_a_model_bigger_than_guessed_waits_for_a_busy_model_then_stays() -> None:
    device = FakeDevice({"a": 100, "b": 150})
    residents = residents_of(device, budget_mb=200)
    for name in ("a", "b"):
        residents.track(name, pinned=False, on_demand=True, estimate=10 * MB)
    residents.demand("a", time.time() + 10)
    await until(lambda: residents.records["a"].state == "ready")
    device.busy.add("a")  # a request in hand
    residents.demand("b", time.time() + 10)
    await asyncio.sleep(0.3)  # b loaded, 250 MB held: it serves and waits for a to idle
    assert residents.records["b"].state == "ready" and device.refused == []
    assert residents.records["a"].state == "ready"
    device.busy.clear()
    await until(lambda: residents.records["a"].state == "evicted")
    assert residents.records["b"].state == "ready" and residents.held() == 150 * MB


async def test_a_measure_is_the_estimate_of_its_family() -> None:
    device = FakeDevice({"x": 80, "y": 80})
    residents = residents_of(device, budget_mb=1000)
    residents.track("x", pinned=False, on_demand=True, estimate=300 * MB, family="minilm-fp32")
    residents.track("y", pinned=False, on_demand=True, estimate=300 * MB, family="minilm-fp32")
    residents.demand("x", time.time() + 10)
    await until(lambda: residents.records["x"].state == "ready")
    assert residents.records["y"].expected_bytes == 80 * MB
    residents.track("z", pinned=False, on_demand=True, estimate=300 * MB, family="minilm-fp32")
    assert residents.records["z"].expected_bytes == 80 * MB  # a sibling added later


async def test_the_wait_told_counts_the_loads_ahead() -> None:
    device = FakeDevice({"a": 10, "b": 10, "c": 10})
    residents = residents_of(device, budget_mb=1000)
    for name in ("a", "b", "c"):
        residents.track(name, pinned=False, on_demand=True, estimate=None)
    now = time.time()
    a, b, c = (residents.records[name] for name in ("a", "b", "c"))
    a.load_s, b.load_s, c.load_s = 4.0, 3.0, 2.0
    a.state, a.loading_since = "loading", now - 1.0  # 3 s left
    assert residents._expected_wait(b, now) == 6.0
    # c was asked for before b and waits for the lock: b waits for all of it too
    never = asyncio.get_running_loop().create_future()
    for name in ("a", "c", "b"):
        residents._loads[name] = asyncio.ensure_future(never)
    assert residents._expected_wait(b, now) == 8.0
    assert residents._expected_wait(c, now) == 5.0
    never.cancel()


class Leaky(FakeDevice):
    """Each unload keeps a fifth of the model; the first prepare imports 500 MB."""

    async def unload(self, name: str) -> None:
        await super().unload(name)
        self.kept += self.sizes[name] // 5

    async def prepare(self, name: str) -> str:
        self.libraries = 500
        return "embed:torch"


async def test_memory_an_eviction_leaves_behind_counts_against_the_budget() -> None:
    device = Leaky({name: 100 for name in "abcdef"})
    residents = Residents(
        250, device.load, device.unload, lambda name: False, device.refuse, prepare=device.prepare
    )
    residents.attach("cpu", device)
    for name in "abcdef":
        residents.track(name, pinned=False, on_demand=True, estimate=100 * MB)
    for name in "abcdef":
        residents.demand(name, time.time() + 10)
        await until(lambda name=name: residents.records[name].state == "ready")
        # The budget holds on what the device holds beyond the libraries, measured.
        assert (device.used() - 500 * MB) <= 250 * MB, (name, device.kept)
    assert residents.outside == 500 * MB  # imported once, measured once
    assert residents.unaccounted() == device.kept * MB == 100 * MB  # five evictions
    ready = [r.name for r in residents.records.values() if r.state == "ready"]
    assert ready == ["f"]  # counted by the records alone, "e" would have stayed


async def test_a_load_that_memory_outside_the_models_keeps_out_is_refused_at_once() -> None:
    device = FakeDevice({"big": 200, "small": 100})
    residents = residents_of(device, budget_mb=250)
    for name in ("big", "small"):
        residents.track(name, pinned=False, on_demand=True, estimate=device.sizes[name] * MB)
    device.kept = 100  # left behind by earlier evictions: no idle model can make up for it
    started = time.monotonic()
    residents.demand("big", time.time() + 60)
    await until(lambda: device.refused != [])
    assert time.monotonic() - started < 5  # not held until its deadline, 60 s away
    [(name, error)] = device.refused
    assert name == "big" and isinstance(error, NoRoom) and "100 MB are held beyond" in error.message
    assert residents.records["big"].state == "evicted"  # a later request tries again
    residents.demand("small", time.time() + 60)  # the lock is free: another model loads
    await until(lambda: residents.records["small"].state == "ready")
