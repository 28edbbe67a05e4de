"""A real Apache Kafka broker for tests and benchmarks: one KRaft node (broker and controller
in one JVM) on loopback ports, its jars pinned in pom.xml and resolved from Maven Central
into a cache outside the repo (jars.py), started and stopped by broker.py, offered to tests
as the session fixture ``kafka_broker`` (fixtures.py)."""
