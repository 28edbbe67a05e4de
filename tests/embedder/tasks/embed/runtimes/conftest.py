"""Tiny random models and a shared export cache for the runtime tests (plumbing only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from embedder.core.fleet import ModelSpec, Precision, Profile, Source
from embedder.core.jobs import Task
from tests.tiny_models import build_tiny_embedder, build_tiny_reranker


@pytest.fixture(scope="session")
def tiny_embedder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_embedder(tmp_path_factory.mktemp("tiny-embedder"))


@pytest.fixture(scope="session")
def tiny_reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_reranker(tmp_path_factory.mktemp("tiny-reranker"))


@pytest.fixture(scope="session")
def cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the session, so each export is built once across tests."""
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(autouse=True)
def exports_in_cache_home(cache_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield


def spec_for(
    folder: Path,
    runtime: str,
    dtype: Precision = "float32",
    *,
    task: Task = Task.EMBED,
    **fields: object,
) -> ModelSpec:
    profile = Profile(runtime=runtime, dtype=dtype, forward_tokens=256, forward_max_sequences=8)
    return ModelSpec(
        name="tiny",
        source=Source(path=folder),
        task=task,
        max_tokens=64,
        profiles={"cpu": profile},
        **fields,  # type: ignore[arg-type]
    )


def worst_cosine(a: NDArray[np.float32], b: NDArray[np.float32]) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())


# Mixed lengths, some past the tiny model's 64-token window, so passes and truncation vary.
TEXTS = [" ".join(f"word{j} fox" for j in range((i * 7) % 45 + 1)) + f" end {i}" for i in range(20)]
