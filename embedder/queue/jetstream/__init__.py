"""The work queue over NATS JetStream, for many machines: a shared queue, per message.

Gateways (``submitter.JetStreamSubmitter``) publish each job to the work-queue
stream on its model's subject, ``<prefix>.<model>``: the raw body as the payload,
the annotations as headers (``wire``). Workers (``puller.JetStreamPuller``) of one
model share one durable pull consumer filtered to that subject, so a worker pulls
only the models it hosts, and any of them may take any request: a slow or stopped
worker's backlog is simply fetched by the others. A worker fetches about its token
budget from the hosted model with the most requests waiting (the consumers' pending
counts; it waits on every hosted model's consumer at once only when none has any),
hands back with ``nak(delay)`` what does not fit, ``term()``s what expired, and acks
a job only once its reply is published to the gateway's own inbox subject. What it
cannot finish before the deadline, and what a fetch left open brings while it runs a
batch, it hands back at once (``nak`` without delay): a busy worker holds nothing it
is not running, so a worker that asks takes it now.

Delivery is at least once: a job a worker holds unacknowledged past ``ack_wait``
(it died, or it is stopped) goes to another worker; the gateway keeps the first
reply. Past ``max_deliver`` deliveries the server announces the job, a worker moves
it to the dead-letter stream with the reason, and its gateway answers the client
with ``Undeliverable``. Workers record their models in a KV bucket (``liveness``)
that gateways watch to answer 503 at once for a model no live worker serves.
``config`` holds the settings and names; ``streams`` creates streams, consumers and
the bucket; ``connection`` keeps each side's connection, and what that side needs on the
server, through broker restarts: made again after every reconnect, and refused at once
(503) while the broker is unreachable.
This file imports nothing, so the pure ``wire`` loads without nats.
"""
