"""The real nats-server with JetStream (``bench.services.nats``) offered to tests as the
session fixture ``nats_server`` (fixtures.py)."""
