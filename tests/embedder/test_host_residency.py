"""Models loaded on demand within a memory budget, on the host of one machine: the first
request loads a model (requests meanwhile share the load), the least recently used idle
model is evicted to make room, a load that runs out of memory fails that model alone,
a load longer than a request's deadline answers 503 at once with Retry-After, and
models join and leave the fleet while it serves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from embedder.core.errors import NotReady
from embedder.core.fleet import DeviceKind, Fleet, ModelSpec
from embedder.core.jobs import JobResult
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.residency import keeper
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.registry import encoder_loaders
from tests.embedder.tasks.embed.test_worker import Client, outcome, until, vectors_of
from tests.fakes import FakeLoader, FakeRuntime, fake_fleet

MB = 1 << 20


class SizedLoader(FakeLoader):
    """FakeRuntimes that take ``sizes[name]`` MB of the fake device while alive; a model
    named in ``out_of_memory`` raises MemoryError as it loads, ``slow_s`` delays loads."""

    def __init__(self, sizes: dict[str, int], *, out_of_memory: Collection[str] = (),
                 slow_s: float = 0.0) -> None:  # fmt: skip
        super().__init__()
        self.sizes = sizes
        self.out_of_memory = out_of_memory
        self.slow_s = slow_s
        self.loads: list[str] = []

    def __call__(self, spec: ModelSpec, device: DeviceKind, threads: int) -> FakeRuntime:
        self.loads.append(spec.name)
        time.sleep(self.slow_s)
        if spec.name in self.out_of_memory:
            raise MemoryError(f"cannot allocate {self.sizes[spec.name]} MB")
        return super().__call__(spec, device, threads)


class FakeDeviceMemory:
    """The device's memory: what the loader's live runtimes hold (a runtime the host let
    go of is gone once released)."""

    def __init__(self, loader: SizedLoader, host: Callable[[], ModelHost]) -> None:
        self.loader = loader
        self.host = host

    def used(self) -> int:
        served = self.host().served
        return sum(self.loader.sizes[name] * MB for name in served)

    def release(self) -> None:
        pass

    def settle(self) -> None:
        pass

    def reset_peak(self) -> None:
        pass

    def peak(self) -> int:
        return self.used()


def host_for(fleet: Fleet, loader: SizedLoader, budget_mb: float, **kwargs: Any) -> ModelHost:
    queue = InProcessQueue()
    host: ModelHost | None = None
    meter = FakeDeviceMemory(loader, lambda: host)  # type: ignore[arg-type, return-value]
    host = ModelHost(
        fleet,
        queue,
        options=[RequestLimits()],
        device="cpu",
        loaders=encoder_loaders(loader),
        untuned="defaults",
        memory_budget_mb=budget_mb,
        backlog=queue.depth,
        memory_meter=meter,
        **kwargs,
    )
    return host


def on_demand(*names: str, tmp: Path) -> Fleet:
    """On-demand entries, each of its own weights (a family of its own: the fakes' sizes
    differ by name)."""
    models = {}
    for name in names:
        (tmp / name).mkdir(exist_ok=True)
        models.update(fake_fleet(name, tmp=tmp / name, load="on_demand").models)
    return Fleet.model_validate({"models": models})


CLIENTS: dict[int, Client] = {}


def client_of(host: ModelHost) -> Client:
    """One client per host: its job ids count up."""
    assert isinstance(host.queue, InProcessQueue)
    return CLIENTS.setdefault(id(host.queue), Client(host.queue))


async def ask(host: ModelHost, model: str, text: str, timeout_s: float = 10.0) -> JobResult:
    """A request as the gateway makes it: demand the model, then queue the job."""
    host.demand(model, time.time() + timeout_s)
    result = await outcome(await client_of(host).embed(model, [text]))
    assert isinstance(result, JobResult), result
    return result


def check(host: ModelHost, loader: SizedLoader, model: str, result: JobResult, text: str) -> None:
    expected = loader.runtimes[model].expected_vector(text)
    assert vectors_of(result)[0] == pytest.approx(expected, abs=1e-6)


async def test_an_on_demand_model_loads_for_its_first_request_and_shares_the_load(
    tmp_path: Path,
) -> None:
    loader = SizedLoader({"a": 100, "b": 100}, slow_s=0.2)
    host = host_for(on_demand("a", "b", tmp=tmp_path), loader, budget_mb=1000)
    async with host:
        await host.wait_ready()
        assert host.state("a") == "evicted" and host.served == {}
        texts = [f"text {i}" for i in range(5)]
        results = await asyncio.gather(*(ask(host, "a", t) for t in texts))
        for text, result in zip(texts, results, strict=True):
            check(host, loader, "a", result, text)
        assert loader.loads == ["a"]  # five requests, one load
        described = host.describe("a")
        assert host.state("a") == "ready" and host.state("b") == "evicted"
        assert described["memory_bytes"] == 100 * MB and described["loads"] == 1
        assert isinstance(described["load_s"], float) and described["load_s"] >= 0.2


async def test_the_least_recently_used_idle_model_is_evicted_to_make_room(tmp_path: Path) -> None:
    loader = SizedLoader({"a": 100, "b": 100, "c": 100})
    host = host_for(on_demand("a", "b", "c", tmp=tmp_path), loader, budget_mb=250)
    async with host:
        await host.wait_ready()
        await ask(host, "a", "one")
        await ask(host, "b", "two")
        await ask(host, "a", "three")  # b is now the least recently used
        check(host, loader, "c", await ask(host, "c", "four"), "four")
        assert [host.state(m) for m in "abc"] == ["ready", "evicted", "ready"]
        assert host.residents.held() == 200 * MB
        assert host.describe("b")["evictions"] == 1 and host.describe("b")["memory_bytes"] == 0
        check(host, loader, "b", await ask(host, "b", "five"), "five")  # loads again
        assert loader.loads == ["a", "b", "c", "b"]
        assert host.state("a") == "evicted"  # a was used before c


async def test_pinned_models_stay_and_a_model_that_cannot_fit_fails_alone(tmp_path: Path) -> None:
    fleet = fake_fleet("pinned", tmp=tmp_path)  # load: start, so pinned
    fleet = fleet.model_copy(
        update={"models": {**fleet.models, **on_demand("big", "small", tmp=tmp_path).models}}
    )
    loader = SizedLoader({"pinned": 200, "big": 200, "small": 50})
    host = host_for(fleet, loader, budget_mb=300)
    async with host:
        await host.wait_ready()
        assert host.state("pinned") == "ready"
        host.demand("big", time.time() + 10)
        error = await outcome(await client_of(host).embed("big", ["too big"]))
        assert isinstance(error, NotReady) and "the budget (300 MB" in error.message
        assert host.state("big") == "failed" and host.residents.held() == 200 * MB
        check(host, loader, "small", await ask(host, "small", "fits"), "fits")
        check(host, loader, "pinned", await ask(host, "pinned", "still"), "still")


async def test_a_load_out_of_memory_evicts_retries_once_then_fails_that_model_alone(
    tmp_path: Path,
) -> None:
    loader = SizedLoader({"a": 100, "oom": 100}, out_of_memory={"oom"})
    host = host_for(on_demand("a", "oom", tmp=tmp_path), loader, budget_mb=1000)
    async with host:
        await host.wait_ready()
        await ask(host, "a", "before")
        host.demand("oom", time.time() + 10)
        future = await client_of(host).embed("oom", ["never"])
        error = await outcome(future)
        assert isinstance(error, NotReady) and "MemoryError" in error.message
        assert loader.loads.count("oom") == 2  # tried, evicted the idle a, tried again
        assert host.state("oom") == "failed" and host.state("a") == "evicted"
        with pytest.raises(NotReady, match="failed to load: MemoryError"):
            host.demand("oom", time.time() + 10)
        check(host, loader, "a", await ask(host, "a", "after"), "after")


async def test_a_load_longer_than_the_deadline_answers_503_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = SizedLoader({"a": 100, "b": 100}, slow_s=0.3)
    host = host_for(on_demand("a", "b", tmp=tmp_path), loader, budget_mb=150)
    async with host:
        await host.wait_ready()
        await ask(host, "a", "measured")
        await ask(host, "b", "evicts a")
        host.residents.records["a"].load_s = 12.0  # as if a took 12 s to load
        with pytest.raises(NotReady) as raised:
            host.demand("a", time.time() + 2.0)
        assert raised.value.headers["Retry-After"] == "12"
        await until(lambda: host.state("a") == "ready")  # the load went on for the retry


async def test_jobs_without_a_request_load_their_model_from_the_backlog(tmp_path: Path) -> None:
    loader = SizedLoader({"a": 100})
    host = host_for(on_demand("a", tmp=tmp_path), loader, budget_mb=1000)
    async with host:
        await host.wait_ready()
        future = await client_of(host).embed("a", ["ingested"])
        result = await outcome(future)
        assert isinstance(result, JobResult)
        check(host, loader, "a", result, "ingested")


async def test_models_join_and_leave_the_fleet_while_serving(tmp_path: Path) -> None:
    loader = SizedLoader({"a": 100, "new": 100}, slow_s=0.05)
    fleet = fake_fleet("a", tmp=tmp_path)
    host = host_for(fleet, loader, budget_mb=1000)
    async with host:
        await host.wait_ready()
        spec = on_demand("new", tmp=tmp_path).models["new"]
        await host.add_model(spec)
        assert "new" in host.fleet.models and host.state("new") == "evicted"
        check(host, loader, "new", await ask(host, "new", "hello"), "hello")
        in_flight = [asyncio.ensure_future(ask(host, "new", f"late {i}")) for i in range(20)]
        await asyncio.sleep(0)
        await host.remove_model("new")
        for i, task in enumerate(in_flight):  # queued before the removal: all answered
            check(host, loader, "new", await task, f"late {i}")
        assert "new" not in host.fleet.models and "new" not in host.served
        assert host.residents.held() == 100 * MB
        with pytest.raises(ValueError, match="in the fleet already"):
            await host.add_model(fake_fleet("a", tmp=tmp_path).models["a"])


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeper, "ROOM_POLL_S", 0.01)
