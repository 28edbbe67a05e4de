"""Cost: device-seconds x the price of the device that ran, and projections by tokens."""

from __future__ import annotations

import pytest

from lora.config import Prices
from lora.cost import project, run_cost, unit_price


def test_cpu_cost_is_cores_times_wall_times_the_core_price() -> None:
    cost = run_cost(device="cpu", device_name="AMD EPYC", units=2, wall_s=1800, prices=Prices())
    assert cost.device_seconds == 3600
    assert cost.price_setting == "price_cpu_core_hour_usd"
    assert cost.usd == pytest.approx(Prices().price_cpu_core_hour_usd)


@pytest.mark.parametrize(
    ("name", "setting"),
    [
        ("NVIDIA H100 80GB HBM3", "price_h100_hour_usd"),
        ("NVIDIA A10G", "price_a10_hour_usd"),
        ("NVIDIA A10", "price_a10_hour_usd"),
        ("NVIDIA L4", "price_l4_hour_usd"),
        ("NVIDIA A100-SXM4-80GB", None),  # not an A10
        ("NVIDIA L40S", None),  # not an L4
    ],
)
def test_gpus_are_priced_by_their_name(name: str, setting: str | None) -> None:
    price, found = unit_price("cuda", name, Prices())
    assert found == setting
    assert (price is None) == (setting is None)


def test_an_unpriced_gpu_has_no_cost_but_keeps_its_seconds() -> None:
    cost = run_cost(device="cuda", device_name="NVIDIA A100", units=1, wall_s=10, prices=Prices())
    assert cost.usd is None and cost.device_seconds == 10


def test_prices_are_settings() -> None:
    cost = run_cost(
        device="cuda", device_name="NVIDIA L4", units=1, wall_s=7200,
        prices=Prices(price_l4_hour_usd=1.5),
    )  # fmt: skip
    assert cost.usd == pytest.approx(3.0)


def test_projection_divides_the_work_by_the_other_throughput() -> None:
    projected = project(tokens=3_600_000, tokens_per_s=1000, price_hour_usd=2.0, device="L4")
    assert projected.seconds == 3600
    assert projected.usd == pytest.approx(2.0)
    with pytest.raises(ValueError):
        project(tokens=1, tokens_per_s=0, price_hour_usd=1, device="L4")
