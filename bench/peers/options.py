"""bench.served's peer options, and which peers a run measures."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bench.peers import PEERS, Peer, get_peer
from bench.peers.compare import DEFAULT_LOADS, Load, parse_loads


def _ints(value: str) -> list[int]:
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers, got {value!r}") from None
    if not numbers or min(numbers) <= 0:
        raise argparse.ArgumentTypeError(f"positive integers, got {value!r}")
    return numbers


def _loads(value: str) -> list[Load]:
    try:
        return parse_loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The peer options of ``bench.served``."""
    group = parser.add_argument_group("peers (other servers measured beside flotilla)")
    group.add_argument(
        "--peer",
        action="append",
        choices=(*PEERS, "none"),
        default=None,
        help="a peer to measure (repeatable); default: every installed one; 'none': no peer",
    )
    group.add_argument(
        "--peer-loads",
        type=_loads,
        default=list(DEFAULT_LOADS),
        help="CLIENTSxTEXTS per request, comma-separated (default 16x8,64x1)",
    )
    group.add_argument(
        "--peer-batch-sizes",
        type=_ints,
        default=[16, 32, 64],
        help="the peer's batch sizes to try; the best counts",
    )
    group.add_argument(
        "--peer-dtypes",
        type=lambda v: [d for d in v.split(",") if d],
        default=["bfloat16"],
        help="the peer's dtypes to try, e.g. bfloat16,float32 (fp32 is much slower)",
    )
    group.add_argument(
        "--peer-duration-s", type=float, default=None, help="per load and side (--duration-s)"
    )
    group.add_argument(
        "--peer-check-texts", type=int, default=32, help="texts the accuracy gate compares"
    )


def chosen_peers(names: Sequence[str] | None) -> list[Peer]:
    """The peers asked for; by default every installed one (a missing one is skipped
    with a line saying how to install it); one asked for by name must be installed."""
    if names is not None and "none" in names:
        return []
    chosen: list[Peer] = []
    for name in names or list(PEERS):
        peer = get_peer(name)
        missing = peer.missing()
        if missing is None:
            chosen.append(peer)
        elif names:
            raise SystemExit(f"--peer {name}: {missing}")
        else:
            print(f"skipping the peer {name}: {missing}")
    return chosen
