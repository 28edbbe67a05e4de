from __future__ import annotations

from pathlib import Path

import pytest

from tests.gateway.conftest import hub_offline
from tests.tiny_models import build_tiny_embedder


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny random BERTs that differ only in their seed."""
    folder = tmp_path_factory.mktemp("tiny-lora")
    with hub_offline():
        return {
            name: build_tiny_embedder(folder / name, seed=seed)
            for name, seed in (("tiny-a", 0), ("tiny-b", 1))
        }
