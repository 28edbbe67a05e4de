"""Prompts end to end with a real (tiny, random-weight) model given e5's prompts: what each
route sends picks the prefix, the prefix counts as tokens, left truncation keeps it,
rerank, ingest and search use the query and document prompts, and a model without
prompts ignores input_type. Expected vectors come from SentenceTransformer.encode on
the prefixed text."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from numpy.typing import NDArray

from embedder.tasks.embed.codecs import RequestLimits
from embedder.core.fleet import DeviceKind, Fleet, ModelSpec
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.tasks.embed.runtimes import Runtime, load_runtime
from flotilla.settings import Settings
from flotilla.wiring import gateway_config
from gateway.app import create_app
from ingest.embedding import QueueEmbedder
from ingest.store import Point, point_id
from ingest.store.qdrant import QdrantStore
from tests.gateway.conftest import hub_offline
from tests.tiny_models import build_tiny_embedder

E5 = "tiny-e5"  # the tiny model with e5's prompts
PLAIN = "tiny"  # the same weights, no prompts
MAX_TOKENS = 64
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-prompts")
    with hub_offline():
        return build_tiny_embedder(folder)


@pytest.fixture(scope="module")
def fleet(model_dir: Path) -> Fleet:
    spec = {
        "source": {"path": str(model_dir)},
        "max_tokens": MAX_TOKENS,
        "profiles": {"cpu": {"dtype": "float32", "max_batch_tokens": 4096, "max_wait_ms": 1}},
    }
    e5 = {
        **spec,
        "prompts": PROMPTS,
        "default_prompt": "query",
        "query_prompt": "query",
        "document_prompt": "passage",
    }
    return Fleet.model_validate({"models": {E5: e5, PLAIN: spec}})


@pytest.fixture(scope="module")
def runtimes(fleet: Fleet) -> Iterator[dict[str, Runtime]]:
    """Each model loaded once for the module; every test's host reuses them."""
    with hub_offline():
        yield {name: load_runtime(spec, "cpu", 2) for name, spec in fleet.models.items()}


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    with hub_offline():
        return SentenceTransformer(str(model_dir), device="cpu")


def ref(reference: Any, texts: list[str], prefix: str = "") -> NDArray[np.float32]:
    vectors = reference.encode([prefix + t for t in texts], normalize_embeddings=True)
    return np.asarray(vectors, dtype=np.float32)


class Served:
    def __init__(self, client: httpx.AsyncClient, queue: InProcessQueue, store: QdrantStore):
        self.client = client
        self.queue = queue
        self.store = store


@pytest.fixture
async def served(fleet: Fleet, runtimes: dict[str, Runtime]) -> AsyncIterator[Served]:
    def loader(spec: ModelSpec, device: DeviceKind, threads: int) -> Runtime:
        return runtimes[spec.name]

    queue = InProcessQueue()
    host = ModelHost(fleet, queue, RequestLimits(), device="cpu", loader=loader)
    store = QdrantStore(location=":memory:")
    app = create_app(gateway_config(Settings()), fleet, queue, host, store=store)
    transport = httpx.ASGITransport(app=app)
    async with host, httpx.AsyncClient(transport=transport, base_url="http://flotilla") as client:
        await host.wait_ready()
        yield Served(client, queue, store)
    await store.close()


TEXTS = ["the tenant returns the keys", "Kündigung des Mietvertrags"]


async def openai_vectors(served: Served, **fields: object) -> tuple[NDArray[np.float32], int]:
    response = await served.client.post("/v1/embeddings", json={"input": TEXTS, **fields})
    assert response.status_code == 200, response.text
    body = response.json()
    vectors = np.asarray([d["embedding"] for d in body["data"]], dtype=np.float32)
    return vectors, int(body["usage"]["prompt_tokens"])


@pytest.mark.parametrize(
    ("input_type", "prefix"),
    [(None, "query: "), ("query", "query: "), ("document", "passage: "), ("passage", "passage: ")],
)
async def test_openai_input_type_picks_the_prompt(
    served: Served, reference: Any, input_type: str | None, prefix: str
) -> None:
    fields: dict[str, object] = {"model": E5}
    if input_type is not None:
        fields["input_type"] = input_type
    got, tokens = await openai_vectors(served, **fields)
    np.testing.assert_allclose(got, ref(reference, TEXTS, prefix), atol=1e-5)
    # The prompt's tokens are the request's tokens too.
    assert tokens == sum(len(reference.tokenizer(prefix + t)["input_ids"]) for t in TEXTS)


async def test_tei_prompt_name_picks_the_prompt(served: Served, reference: Any) -> None:
    for name, prefix in PROMPTS.items():
        body = {"model": E5, "inputs": TEXTS, "prompt_name": name}
        response = await served.client.post("/embed", json=body)
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(response.json(), ref(reference, TEXTS, prefix), atol=1e-5)


async def test_an_unknown_prompt_name_is_422_naming_the_valid_ones(served: Served) -> None:
    body = {"model": E5, "inputs": "x", "prompt_name": "search_query"}
    response = await served.client.post("/embed", json=body)
    assert response.status_code == 422
    error = response.json()
    assert error["error_type"] == "invalid_request"
    assert "no prompt 'search_query'; its prompts: 'passage', 'query'" in error["error"]


async def test_an_unknown_input_type_is_422(served: Served) -> None:
    response = await served.client.post(
        "/v1/embeddings", json={"model": E5, "input": "x", "input_type": "clustering"}
    )
    assert response.status_code == 422
    assert "'input_type' is 'clustering'" in response.json()["error"]["message"]


async def test_a_model_without_prompts_ignores_input_type(served: Served, reference: Any) -> None:
    for input_type in ("query", "document"):
        got, _ = await openai_vectors(served, model=PLAIN, input_type=input_type)
        np.testing.assert_allclose(got, ref(reference, TEXTS), atol=1e-5)
    named = await served.client.post(
        "/embed", json={"model": PLAIN, "inputs": "x", "prompt_name": "query"}
    )
    assert named.status_code == 422
    assert "defines no prompts" in named.json()["error"]


async def test_the_prompt_counts_towards_the_token_limit(served: Served, reference: Any) -> None:
    words = " ".join(["word"] * (MAX_TOKENS - 2))  # with [CLS] and [SEP]: the limit exactly
    assert len(reference.tokenizer(words)["input_ids"]) == MAX_TOKENS
    plain = await served.client.post("/embed", json={"model": PLAIN, "inputs": words})
    assert plain.status_code == 200, plain.text
    prompted = await served.client.post("/embed", json={"model": E5, "inputs": words})
    assert prompted.status_code == 413
    assert "has 66 tokens, over this model's limit of 64" in prompted.json()["error"]


async def test_left_truncation_keeps_the_prompt(served: Served, reference: Any) -> None:
    words = [f"w{i}" for i in range(100)]
    body = {
        "model": E5,
        "inputs": " ".join(words),
        "truncate": True,
        "truncation_direction": "left",
        "prompt_name": "passage",
    }
    response = await served.client.post("/embed", json=body)
    assert response.status_code == 200, response.text
    tok = reference.tokenizer
    prompt_ids = tok("passage:", add_special_tokens=False)["input_ids"]
    text_ids = tok(" ".join(words), add_special_tokens=False)["input_ids"]
    keep = MAX_TOKENS - 2 - len(prompt_ids)
    ids = [tok.cls_token_id, *prompt_ids, *text_ids[-keep:], tok.sep_token_id]
    want = encode_ids(reference, ids)
    np.testing.assert_allclose(response.json()[0], want, atol=1e-5)


def encode_ids(reference: Any, ids: list[int]) -> NDArray[np.float32]:
    import torch

    features = {
        "input_ids": torch.tensor([ids]),
        "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
        "token_type_ids": torch.zeros(1, len(ids), dtype=torch.long),
    }
    with torch.inference_mode():
        vector = reference(features)["sentence_embedding"][0].numpy()
    return np.asarray(vector / np.linalg.norm(vector), dtype=np.float32)


async def test_bi_encoder_rerank_uses_the_query_and_document_prompts(
    served: Served, reference: Any
) -> None:
    docs = ["keys returned by the tenant", "a notice period", "the weather"]
    body = {"model": E5, "query": "who returns the keys", "documents": docs}
    response = await served.client.post("/v1/rerank", json=body)
    assert response.status_code == 200, response.text
    query = ref(reference, ["who returns the keys"], "query: ")[0]
    want = ref(reference, docs, "passage: ") @ query
    got = {r["index"]: r["relevance_score"] for r in response.json()["results"]}
    assert got == pytest.approx(dict(enumerate(want.tolist())), abs=1e-5)


async def test_ingest_embeds_documents_and_search_embeds_queries(
    served: Served, reference: Any
) -> None:
    doc = "the tenant returns the keys"
    (vector,) = await QueueEmbedder(served.queue).embed([(E5, doc)])
    assert isinstance(vector, np.ndarray)
    np.testing.assert_allclose(vector, ref(reference, [doc], "passage: ")[0], atol=1e-5)
    # An evaluation embeds its queries through the same embedder, as queries.
    (as_query,) = await QueueEmbedder(served.queue).embed([(E5, doc)], use="query")
    assert isinstance(as_query, np.ndarray)
    np.testing.assert_allclose(as_query, ref(reference, [doc], "query: ")[0], atol=1e-5)

    # Two points: one holds the query's vector with the query prompt, one without. The
    # search must land exactly on the first.
    query = "who returns the keys"
    await served.store.ensure_collection("leases", 32, "cosine", E5)
    await served.store.upsert(
        "leases",
        [
            Point(point_id("leases", "prompted"), ref(reference, [query], "query: ")[0], {"id": 1}),
            Point(point_id("leases", "bare"), ref(reference, [query])[0], {"id": 2}),
        ],
    )
    response = await served.client.post("/v1/collections/leases/search", json={"query": query})
    assert response.status_code == 200, response.text
    top = response.json()["results"][0]
    assert top["payload"] == {"id": 1}
    assert top["score"] == pytest.approx(1.0, abs=1e-5)
