from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ingest.store.server_fixture import running_store_server


@pytest.fixture(scope="session")
def store_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One store server for the session; tests keep apart by unique collection names."""
    with running_store_server(tmp_path_factory.mktemp("store-server") / "vectors") as url:
        yield url
