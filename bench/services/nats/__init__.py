"""Real ``nats-server -js`` processes on free loopback ports, their JetStream stores in
temporary directories that ``stop()`` removes: ``NatsServer`` (one server) and
``NatsCluster`` (N clustered servers, for replicated streams and broker faults).

``python -m bench.services.nats [--cluster N]`` starts one (or a cluster of N) and prints
the URL(s) until Ctrl-C."""

from bench.services.nats.cluster import NatsCluster
from bench.services.nats.server import (
    HOST,
    MAX_PAYLOAD_BYTES,
    NatsServer,
    NatsSetupError,
    nats_server_binary,
)

__all__ = [
    "HOST",
    "MAX_PAYLOAD_BYTES",
    "NatsCluster",
    "NatsServer",
    "NatsSetupError",
    "nats_server_binary",
]
