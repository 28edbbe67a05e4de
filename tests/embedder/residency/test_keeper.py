"""The keeper alone, over fake loads and a fake device: a model that turns out too big for
the room left waits for a busy model to fall idle rather than failing, a model's measure
is its family's estimate, and the wait a request is told counts the load ahead of it."""

from __future__ import annotations

import asyncio
import time

from embedder.core.errors import FlotillaError
from embedder.residency.keeper import Residents
from tests.embedder.tasks.embed.test_worker import until

MB = 1 << 20


class FakeDevice:
    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        self.loaded: set[str] = set()
        self.busy: set[str] = set()
        self.refused: list[tuple[str, FlotillaError]] = []

    def used(self) -> int:
        return sum(self.sizes[name] * MB for name in self.loaded)

    def release(self) -> None:
        pass

    def settle(self) -> None:
        pass

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


async def test_the_wait_told_counts_the_load_under_way_ahead() -> None:
    device = FakeDevice({"a": 10, "b": 10})
    residents = residents_of(device, budget_mb=1000)
    for name in ("a", "b"):
        residents.track(name, pinned=False, on_demand=True, estimate=None)
    now = time.time()
    a, b = residents.records["a"], residents.records["b"]
    a.load_s, b.load_s = 4.0, 3.0
    a.state, a.loading_since = "loading", now - 1.0  # 3 s left
    assert residents._expected_wait(b, now) == 6.0
