"""``python -m bench.services.nats [--cluster N]``: one server (or a cluster of N) until
Ctrl-C, its URL(s) printed."""

from __future__ import annotations

import argparse
import contextlib
import signal

from bench.services.nats.cluster import NatsCluster
from bench.services.nats.server import NatsServer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.services.nats")
    parser.add_argument("--cluster", type=int, default=0, metavar="N", help="N clustered nodes")
    args = parser.parse_args(argv)
    broker = NatsCluster(args.cluster) if args.cluster else NatsServer()
    # Ctrl-C stops the broker, even while it prints.
    with broker, contextlib.suppress(KeyboardInterrupt):
        print(broker.urls if isinstance(broker, NatsCluster) else broker.url, flush=True)
        signal.pause()


if __name__ == "__main__":
    main()
