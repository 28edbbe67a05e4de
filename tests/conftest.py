import os

import pytest

pytest_plugins = [
    "tests.kafka.fixtures",
    "tests.nats.fixtures",
    "tests.ingest.store.server_fixture",
]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read FLOTILLA_* variables: none from the outer shell may leak in; and a
    wide COLUMNS keeps rich from wrapping help and errors."""
    for name in list(os.environ):
        if name.startswith("FLOTILLA_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")
