"""Tuning where the host runs: with ``untuned='background'`` a model with no tuned profile
serves at once, is tuned in the background (a fake tuner here) and moved to the result;
the result is kept, so the next start serves it before it reports ready; ``defaults``
never tunes; a profile from the same CPU with other cores is borrowed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedder import host as host_module
from embedder.core.fleet import DeviceKind, Fleet, ModelSpec
from embedder.host import LocalTuning, ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.engine import LoadedEncoders
from embedder.tasks.registry import encoder_loaders
from embedder.tuned import Measured, TunedEntry, TunedProfiles
from embedder.tuning.cache import read_cache
from tests.embedder.tasks.embed.test_worker import WAIT_S, Client, until, vectors_of
from tests.fakes import FakeLoader, FakeRuntime, fake_fleet

FP = "cpu:fake-cpu:avx2:2c"
TUNED = {"runtime": "torch", "dtype": "bfloat16", "threads": 2, "max_batch_tokens": 1024}


def tuned_entry(profile: dict[str, Any] = TUNED) -> TunedEntry:
    return TunedEntry(profile=profile, measured=Measured(tokens_per_s=9000.0, worst_cosine=0.9999))


class FakeTuner:
    """Answers ``entry`` once let go (``release``), counting its calls."""

    def __init__(self, entry: TunedEntry | None = None) -> None:
        self.entry = entry if entry is not None else tuned_entry()
        self.calls: list[str] = []
        self.release = asyncio.Event()

    async def __call__(
        self, spec: ModelSpec, device: DeviceKind, threads: int, budget_s: float
    ) -> TunedEntry | None:
        self.calls.append(spec.name)
        await self.release.wait()
        return self.entry


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    monkeypatch.setattr(host_module, "fingerprint", lambda device: FP)
    weights = tmp_path / "model"
    weights.mkdir()
    (weights / "weights.bin").write_bytes(b"fake weights")
    return fake_fleet("open", tmp=weights)


def host_for(
    fleet: Fleet, tuner: FakeTuner, cache: Path, untuned: str = "background", **kwargs: Any
) -> tuple[ModelHost, FakeLoader]:
    loader = FakeLoader()
    host = ModelHost(
        fleet,
        InProcessQueue(),
        options=[RequestLimits()],
        device="cpu",
        loaders=encoder_loaders(loader),
        untuned=untuned,  # type: ignore[arg-type]
        tuning=LocalTuning(cache, budget_s=5.0, tuner=tuner),
        **kwargs,
    )
    return host, loader


def source(host: ModelHost) -> object:
    profile = host.describe("open")["profile"]
    assert isinstance(profile, dict)
    return profile["source"]


def served_dtype(host: ModelHost) -> str:
    return LoadedEncoders(host.engines)["open"].spec.profile("cpu").dtype


async def answer(host: ModelHost, runtime: FakeRuntime, text: str) -> None:
    future = await Client(host.queue).embed("open", [text])  # type: ignore[arg-type]
    result = await asyncio.wait_for(future, WAIT_S)
    np.testing.assert_allclose(vectors_of(result), [runtime.expected_vector(text)], atol=1e-6)


async def test_a_background_tune_switches_the_model_and_the_next_start_is_tuned_before_ready(
    fleet: Fleet, tmp_path: Path
) -> None:
    cache = tmp_path / "cache" / "profiles.yaml"
    tuner = FakeTuner()
    host, loader = host_for(fleet, tuner, cache)
    async with host:
        await host.wait_ready()
        assert host.state("open") == "ready" and source(host) == "tuning"
        assert served_dtype(host) == "auto"  # the fleet's own while the tune runs
        await until(lambda: tuner.calls == ["open"])
        await answer(host, loader.runtimes["open"], "served before the tune ends")
        tuner.release.set()
        await until(lambda: source(host) == "cached")
        assert served_dtype(host) == "bfloat16"
        await answer(host, loader.runtimes["open"], "served after the switch")
    kept = read_cache(cache).models["open"][FP]
    assert kept.profile == TUNED and kept.libraries.keys() == {"torch", "onnxruntime", "openvino"}

    again = FakeTuner()
    second, _ = host_for(fleet, again, cache)
    async with second:
        await second.wait_ready()
        assert source(second) == "cached" and served_dtype(second) == "bfloat16"
        await asyncio.sleep(0.01)
    assert again.calls == []  # loaded with the kept profile: nothing to tune


async def test_defaults_never_tunes(fleet: Fleet, tmp_path: Path) -> None:
    tuner = FakeTuner()
    host, _ = host_for(fleet, tuner, tmp_path / "profiles.yaml", untuned="defaults")
    async with host:
        await host.wait_ready()
        await asyncio.sleep(0.01)
        assert source(host) == "fleet" and served_dtype(host) == "auto"
    assert tuner.calls == []


async def test_a_tune_that_finds_nothing_leaves_the_fleets_profile(
    fleet: Fleet, tmp_path: Path
) -> None:
    tuner = FakeTuner()
    tuner.entry = None  # type: ignore[assignment]
    tuner.release.set()
    host, _ = host_for(fleet, tuner, tmp_path / "profiles.yaml")
    async with host:
        await host.wait_ready()
        await until(lambda: tuner.calls == ["open"] and source(host) == "fleet")
        assert served_dtype(host) == "auto"
    assert not (tmp_path / "profiles.yaml").exists()


async def test_a_profile_from_the_same_cpu_with_more_cores_is_borrowed_then_confirmed(
    fleet: Fleet, tmp_path: Path
) -> None:
    shipped = TunedProfiles().with_entry(
        "open", "cpu:fake-cpu:avx2:8c", tuned_entry({**TUNED, "threads": 8})
    )
    tuner = FakeTuner()  # tunes the same profile here: the borrowed one is confirmed
    host, loader = host_for(fleet, tuner, tmp_path / "profiles.yaml", tuned=shipped)
    async with host:
        await host.wait_ready()
        described = host.describe("open")["profile"]
        assert isinstance(described, dict) and described["source"] == "borrowed"
        assert "borrowed from 8 cores" in str(described["why"])
        loaded = LoadedEncoders(host.engines)["open"].spec.profile("cpu")
        assert (loaded.dtype, loaded.threads) == ("bfloat16", 2)  # 8 of 8 -> 2 of 2
        runtime = loader.runtimes["open"]
        tuner.release.set()
        await until(lambda: source(host) == "cached")
        assert loader.runtimes["open"] is runtime  # confirmed: not loaded again


async def test_a_tuned_runtime_that_cannot_take_the_models_adapters_is_not_switched_to(
    fleet: Fleet, tmp_path: Path
) -> None:
    tuner = FakeTuner(tuned_entry({**TUNED, "runtime": "emulated", "dtype": "float32"}))
    tuner.release.set()
    host, loader = host_for(fleet, tuner, tmp_path / "profiles.yaml", adapter_models=["open"])
    async with host:
        await host.wait_ready()
        runtime = loader.runtimes["open"]
        await until(lambda: tuner.calls == ["open"] and source(host) == "fleet")
        assert loader.runtimes["open"] is runtime and served_dtype(host) == "auto"
