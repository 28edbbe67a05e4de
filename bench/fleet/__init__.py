"""A fleet wider than memory: ``flotilla bench fleet`` (``bench.fleet.run``). The pieces:
``fleetfile`` (the entries and the fleet file), ``traffic`` (the shifting Zipf load, pure),
``clients`` (the open-loop sender), ``check`` (the reference vectors), ``memory`` (the
100 ms sampler and its bound), ``calibrate`` (what a model and a runtime cost, and the
budget), ``state`` (what /v1/models and /metrics say), ``server`` (the server under test),
``accounting`` and ``report`` (per-model rows, the verdict, JSON and Markdown) and
``chart``.

The entry imports the run only when called, so that importing the package (as the tests
of its pure parts do) loads no HTTP client or model."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from bench.fleet import run

    return run.main(argv)
