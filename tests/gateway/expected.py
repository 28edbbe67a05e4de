"""What the fakes must answer, computed independently of the gateway and the worker."""

from __future__ import annotations

import base64
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from tests.fakes import FakeRuntime


def embedding(
    runtime: FakeRuntime, text: str, *, normalize: bool = True, dimensions: int | None = None
) -> NDArray[np.float32]:
    vector = runtime.expected_vector(text, normalize=False)[:dimensions]
    return vector / np.linalg.norm(vector) if normalize else vector


def embeddings(
    runtime: FakeRuntime,
    texts: Sequence[str],
    *,
    normalize: bool = True,
    dimensions: int | None = None,
) -> NDArray[np.float32]:
    return np.stack(
        [embedding(runtime, t, normalize=normalize, dimensions=dimensions) for t in texts]
    )


def cross_logit(runtime: FakeRuntime, query: str, doc: str) -> float:
    """A fake cross-encoder scores the pair as one text: the first component of its vector."""
    return float(runtime.expected_vector(f"{query} {doc}", normalize=False)[0])


def cross_score(runtime: FakeRuntime, query: str, doc: str) -> float:
    return float(1.0 / (1.0 + np.exp(-cross_logit(runtime, query, doc))))


def cosine_score(runtime: FakeRuntime, query: str, doc: str) -> float:
    """A bi-encoder reranks by the cosine of the document to the query."""
    return float(embedding(runtime, query) @ embedding(runtime, doc))


def prompt_tokens(texts: Sequence[str]) -> int:
    return sum(len(FakeRuntime.word_ids(t)) for t in texts)


def openai_vectors(body: dict[str, object]) -> NDArray[np.float32]:
    """The vectors of an OpenAI-shaped response, float or base64, in input order."""
    data = body["data"]
    assert isinstance(data, list)
    assert [item["index"] for item in data] == list(range(len(data)))
    assert all(item["object"] == "embedding" for item in data)
    rows = [
        np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        if isinstance(item["embedding"], str)
        else np.asarray(item["embedding"], dtype=np.float32)
        for item in data
    ]
    return np.stack(rows)
