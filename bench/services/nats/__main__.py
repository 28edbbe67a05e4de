"""``python -m bench.services.nats [--cluster N]``: one server (or a cluster of N) until
Ctrl-C, its URL(s) printed."""

from __future__ import annotations

import argparse
import signal
import threading

from bench.services.nats.cluster import NatsCluster
from bench.services.nats.server import NatsServer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.services.nats")
    parser.add_argument("--cluster", type=int, default=0, metavar="N", help="N clustered nodes")
    args = parser.parse_args(argv)
    broker = NatsCluster(args.cluster) if args.cluster else NatsServer()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with broker:
        print(broker.urls if isinstance(broker, NatsCluster) else broker.url, flush=True)
        # Not signal.pause(): a Ctrl-C that lands between the check for signals and the
        # pause itself is never seen, and the broker runs on. A wait that wakes up does.
        while not stop.wait(0.5):
            pass


if __name__ == "__main__":
    main()
