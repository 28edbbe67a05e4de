"""``flotilla bench cluster``: push versus pull, simulated (``bench.cluster_sim``, the
default) or with real processes on this machine (``--real``: ``bench.cluster_real``)."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(argv or [])
    if "--real" in args:
        args.remove("--real")
        from bench import cluster_real

        return cluster_real.main(args)
    if "-h" in args or "--help" in args:
        print("(--real: real processes instead, a router against Kafka; see --real --help)\n")
    from bench import cluster_sim

    return cluster_sim.main(args)
