"""What a training run cost: measured device-seconds times a list price per device-hour.

Measured: wall time of the training loop, the device it ran on, how many CPU cores the
process used (``torch`` threads) and the CPU time it consumed, and the real tokens
(padding excluded) it pushed through forward and backward, hence tokens/s.

Assumed: the prices (``lora.config.Prices``, list prices with their sources), and that
the run held its device for the whole wall time (a rented core or GPU bills while it
waits too).

A GPU's cost cannot be derived from a CPU run: speed ratios between a CPU and a GPU
depend on the model, the sequence lengths and the batch size. What carries over is
the work, in tokens. ``project`` turns tokens and a throughput measured on (or
documented for) another device into that device's time and cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lora.config import Prices

# Words in torch.cuda.get_device_name() -> the price field for that GPU. Whole words:
# an A100 is not an A10, an L40S not an L4.
GPU_PRICE_FIELDS: dict[re.Pattern[str], str] = {
    re.compile(r"\bH100\b"): "price_h100_hour_usd",
    re.compile(r"\bA10G?\b"): "price_a10_hour_usd",
    re.compile(r"\bL4\b"): "price_l4_hour_usd",
}


@dataclass(frozen=True, slots=True)
class Cost:
    device: str  # "cpu" or "cuda"
    device_name: str
    units: int  # CPU cores or GPUs held
    device_seconds: float  # units x wall seconds
    price_per_unit_hour_usd: float | None  # None: no list price for this device
    price_setting: str | None  # the setting the price came from
    usd: float | None


def unit_price(device: str, device_name: str, prices: Prices) -> tuple[float | None, str | None]:
    """The price per unit-hour for a device, and the setting that holds it."""
    if device == "cpu":
        return prices.price_cpu_core_hour_usd, "price_cpu_core_hour_usd"
    for pattern, setting in GPU_PRICE_FIELDS.items():
        if pattern.search(device_name.upper()):
            price: float = getattr(prices, setting)
            return price, setting
    return None, None


def run_cost(*, device: str, device_name: str, units: int, wall_s: float, prices: Prices) -> Cost:
    price, setting = unit_price(device, device_name, prices)
    device_seconds = units * wall_s
    usd = None if price is None else device_seconds / 3600 * price
    return Cost(device, device_name, units, device_seconds, price, setting, usd)


@dataclass(frozen=True, slots=True)
class Projection:
    device: str
    tokens: int
    tokens_per_s: float  # the other device's training throughput: measured or documented
    seconds: float
    usd: float


def project(tokens: int, tokens_per_s: float, price_hour_usd: float, device: str) -> Projection:
    """The time and cost of the same work (``tokens``) at another device's throughput."""
    if tokens_per_s <= 0:
        raise ValueError("tokens_per_s must be positive")
    seconds = tokens / tokens_per_s
    return Projection(device, tokens, tokens_per_s, seconds, seconds / 3600 * price_hour_usd)
