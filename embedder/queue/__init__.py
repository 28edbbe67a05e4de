"""The shared queue between gateways and workers, one substrate per module or package.

``protocol`` says what both sides agree on (re-exported here); ``inprocess``
serves one machine; ``jetstream`` spans many. Importing this package or
``inprocess`` never imports a broker's client: the gateway of the one-machine
service needs none.
"""

from embedder.queue.protocol import (
    JobPuller,
    JobSubmitter,
    Outcome,
    Partial,
    ReplyStream,
    StreamingPuller,
    StreamingSubmitter,
    WorkQueue,
    resolve,
)

__all__ = [
    "JobPuller",
    "JobSubmitter",
    "Outcome",
    "Partial",
    "ReplyStream",
    "StreamingPuller",
    "StreamingSubmitter",
    "WorkQueue",
    "resolve",
]
