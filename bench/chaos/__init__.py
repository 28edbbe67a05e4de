"""Broker faults under load: ``flotilla bench chaos`` (``bench.chaos.run``). The pieces:
``accounting`` (pure: answers and phases in, per-phase outcomes, latency and recovery
time out), ``load`` (the checked closed-loop clients), ``faults`` (what is injected, in
which phases) and ``stack`` (the broker, gateway and workers it runs on).

The entry imports the run only when called, so that importing the package (as the
tests of its pure parts do) loads no HTTP client or model."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from bench.chaos import run

    return run.main(argv)
