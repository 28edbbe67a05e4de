"""The push-versus-pull study: ``flotilla bench cluster`` runs it simulated
(``bench.cluster.sim``, the default) or with real processes on this machine
(``--real``: ``bench.cluster.real``; ``--scale``: 16-64 emulated worker processes,
``bench.cluster.scale``).

The entry imports its side only when called, so that importing the package costs
nothing and the simulation never loads the real run's HTTP and JetStream stack."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(argv or [])
    if "--scale" in args:
        args.remove("--scale")
        from bench.cluster import scale

        return scale.main(args)
    if "--real" in args:
        args.remove("--real")
        from bench.cluster import real

        return real.main(args)
    if "-h" in args or "--help" in args:
        print("(--real: real processes instead, a router against JetStream; see --real --help)\n")
    from bench.cluster import sim

    return sim.main(args)
