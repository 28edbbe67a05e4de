"""The German laws the page set quotes: the shared ones where this checkout has them
beside it, else the suite's small laws in the same format (a clean clone elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ocr_data.pageset import DEFAULT_GESETZE
from tests.lora.laws import write_laws


@pytest.fixture(scope="session")
def gesetze(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if DEFAULT_GESETZE.is_dir() and any(DEFAULT_GESETZE.glob("*.md")):
        return DEFAULT_GESETZE
    return write_laws(tmp_path_factory.mktemp("gesetze"))
