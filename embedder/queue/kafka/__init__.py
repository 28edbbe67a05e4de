"""The work queue over Kafka, for many machines.

Gateways (``submitter.KafkaSubmitter``) produce each job to the request
topic: the raw body as the value, the annotations as headers (``wire``).
Workers (``puller.KafkaPuller``) form one consumer group over that topic; each
pulls from what its partitions hold, up to its token budget, and sends every
result to the reply topic named in the job, where one gateway waits for it.

Delivery is at least once. A worker commits a partition only up to its first
job whose reply the broker has not acknowledged, so the requests of a worker
that dies go to the next owner of its partitions; a result may then arrive
twice, and the gateway keeps the first. A request nobody answers ends at the
gateway's deadline (504), never in a hang. Cancelling is local to the gateway:
a withdrawn job may still run and its reply is dropped; a job whose deadline
has passed when a worker reads it is skipped.

Beside the queue, workers publish which models they serve and gateways read it
(``heartbeat``); ``topics`` creates the topics and holds the client settings
they share. This file imports nothing, so the pure ``wire`` loads without
aiokafka.
"""
