"""The tiny model the tracing tests serve, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gateway.conftest import hub_offline
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file


@pytest.fixture(scope="session")
def tiny_fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-traced")
    with hub_offline():
        return tiny_fleet_file(folder, build_tiny_embedder(folder))
