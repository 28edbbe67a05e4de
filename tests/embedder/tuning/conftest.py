"""A runtime registry with fake runtimes beside torch fp32 (the reference)."""

from __future__ import annotations

import pytest

from embedder.tasks.embed import runtimes


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(runtimes.PRECISIONS):  # only these fakes and torch fp32 are tried
        monkeypatch.delitem(runtimes.PRECISIONS, name)
    monkeypatch.setitem(runtimes.RUNTIMES, "fake", "never.imported:load")
    monkeypatch.setitem(runtimes.RUNTIMES, "absent", "never.imported:load")
    monkeypatch.setitem(runtimes.PRECISIONS, "torch", {"cpu": ("float32",)})
    monkeypatch.setitem(runtimes.PRECISIONS, "fake", {"cpu": ("bfloat16", "float16", "int8")})
    monkeypatch.setitem(runtimes.PRECISIONS, "absent", {"cpu": ("bfloat16",)})
