pytest_plugins = ["tests.kafka.fixtures"]
