"""A device with no tuned profile: the host serves the fleet's profile, or with
``untuned='quick'`` tunes runtime x precision at load, and describe() says which."""

from __future__ import annotations

import pytest

from embedder.tasks.embed.codecs import RequestLimits
from embedder.core.fleet import DeviceKind, ModelSpec
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from tests.embedder.tuning.test_search import BEHAVIOURS, Clock, PerturbedRuntime
from tests.fakes import fake_fleet


def loader(spec: ModelSpec, device: DeviceKind, threads: int) -> PerturbedRuntime:
    profile = spec.profile(device)
    exact = BEHAVIOURS[("torch", "float32")]  # the fleet's own dtype: auto
    behaviour = BEHAVIOURS.get((profile.runtime, profile.dtype), exact)
    return PerturbedRuntime(spec, behaviour, Clock())


@pytest.mark.usefixtures("registry")
@pytest.mark.parametrize("untuned", ["defaults", "quick"])
async def test_an_untuned_device_gets_what_the_setting_says(untuned: str) -> None:
    fleet = fake_fleet("open", "pinned")
    pinned = fleet.models["pinned"]
    profile = pinned.profile("cpu").model_copy(update={"dtype": "float32"})
    fleet = fleet.model_copy(
        update={
            "models": {
                **fleet.models,
                "pinned": pinned.model_copy(update={"profiles": {"cpu": profile}}),
            }
        }
    )
    host = ModelHost(
        fleet,
        InProcessQueue(),
        RequestLimits(),
        device="cpu",
        loader=loader,
        untuned=untuned,  # type: ignore[arg-type]
    )
    async with host:
        await host.wait_ready()
    opened = host.describe("open")["profile"]
    assert isinstance(opened, dict)
    assert opened["source"] == ("quick" if untuned == "quick" else "fleet")
    if untuned == "quick":
        # The fake clock makes no candidate faster than another here; the guard still ran.
        assert "quick tune at load" in opened["why"]
        assert host.loaded["open"].spec.profile("cpu").dtype != "auto"
    else:
        assert opened["why"].startswith("no tuned profile for cpu:")
        assert host.loaded["open"].spec.profile("cpu").dtype == "auto"
    pinned_choice = host.describe("pinned")["profile"]
    assert isinstance(pinned_choice, dict) and pinned_choice["source"] == "fleet"
