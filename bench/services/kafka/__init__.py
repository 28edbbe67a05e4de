"""A real Apache Kafka broker for benchmarks and tests: one KRaft node (broker and controller
in one JVM) on loopback ports, its jars pinned in pom.xml and resolved from Maven Central
into a cache outside the repo (jars.py), started and stopped by broker.py."""
