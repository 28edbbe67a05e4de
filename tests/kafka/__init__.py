"""The real Kafka broker (``bench.services.kafka``) offered to tests as the session fixture
``kafka_broker`` (fixtures.py), and the broker's own tests."""
