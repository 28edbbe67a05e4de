"""The side-by-side run against fake servers: a peer with wrong vectors is refused,
one with right vectors is measured on the same loads as flotilla."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from bench import load
from bench.peers import Launch, PeerConfig, Start, side_by_side
from bench.peers.compare import Load

DIM = 8


def _vector(text: str, wrong: bool) -> np.ndarray:
    seed = sum(map(ord, text)) + (1 if wrong else 0)
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def reference(texts: list[str]) -> np.ndarray:
    out = np.stack([_vector(t, wrong=False) for t in texts])
    return out / np.linalg.norm(out, axis=1, keepdims=True)


@contextlib.contextmanager
def fake_servers() -> Iterator[int]:
    """One aiohttp app on a free port: /right and /wrong answer OpenAI embeddings."""

    async def embed(request: web.Request) -> web.Response:
        body = await request.json()
        wrong = request.path == "/wrong"
        data = [
            {"embedding": base64.b64encode(_vector(t, wrong).tobytes()).decode()}
            if body.get("encoding_format") == "base64"
            else {"embedding": _vector(t, wrong).tolist()}
            for t in body["input"]
        ]
        return web.json_response({"data": data, "usage": {"prompt_tokens": 1}})

    app = web.Application()
    app.router.add_post("/right", embed)
    app.router.add_post("/wrong", embed)
    port = load.free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, load.HOST, port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


class FakePeer:
    name = "fake"
    version = "1"

    def __init__(self, port: int, route_of: dict[str, str]) -> None:
        self.port = port
        self.route_of = route_of  # config name -> route
        self.started: list[str] = []

    def missing(self) -> str | None:
        return None

    @contextlib.contextmanager
    def serve(self, start: Start) -> Iterator[Launch]:
        self.started.append(start.config.name)
        route = self.route_of[start.config.name]
        if route == "down":
            raise RuntimeError("the fake peer did not start")
        yield Launch(f"http://{load.HOST}:{self.port}/{route}", start.model_name, 0)


def _setup(port: int, loads: list[Load]) -> side_by_side.Setup:
    corpus = [f"text number {i}" for i in range(40)]
    plans = {}
    for at in loads:
        bodies, inputs, tokens = [], [], []
        for i in range(50):
            picked = [corpus[(i + k) % len(corpus)] for k in range(at.inputs)]
            bodies.append(load.json.dumps({"model": "m", "input": picked}).encode())
            inputs.append(picked)
            tokens.append(10 * at.inputs)
        plans[at.name] = load.Plan(bodies, inputs, tokens)
    check = corpus[:6]
    return side_by_side.Setup(
        flotilla_url=f"http://{load.HOST}:{port}/right",
        model="m",
        model_dir=Path("."),
        loads=loads,
        plans=plans,
        check_texts=check,
        reference=reference(check),
        threads=1,
        duration_s=0.2,
        max_requests=20,
        warmup_s=0.05,
        request_timeout_s=5,
        ready_timeout_s=5,
        device="cpu",
    )


def test_a_wrong_peer_is_refused_and_a_right_one_is_compared(tmp_path: Path) -> None:
    loads = [Load(2, 3), Load(4, 1)]
    configs = [*side_by_side.configs([16, 32], ["bfloat16"]), PeerConfig("bs8-x", 8, "x")]
    with fake_servers() as port:
        setup = _setup(port, loads)
        assert side_by_side.flotilla_cosine(setup) == pytest.approx(1.0)
        peer = FakePeer(port, {"bs16-bfloat16": "wrong", "bs32-bfloat16": "right", "bs8-x": "down"})
        result = side_by_side.run_peer(peer, configs, setup, tmp_path)
    assert peer.started == ["bs16-bfloat16", "bs32-bfloat16", "bs8-x"]
    refused = result["configs"]["bs16-bfloat16"]
    assert "do not count" in refused["refused"] and "loads" not in refused
    assert result["configs"]["bs8-x"]["skipped"].startswith("RuntimeError")
    assert result["best_config"] == "bs32-bfloat16"
    rows = result["rows"]
    assert [r["load"] for r in rows] == ["2x3", "4x1"]
    for row in rows:
        assert row["peer_tokens_per_s"] > 0 and row["flotilla_tokens_per_s"] > 0
        assert row["ratio_flotilla_over_peer"] == pytest.approx(
            row["flotilla_tokens_per_s"] / row["peer_tokens_per_s"]
        )
    assert "flotilla/fake" in side_by_side.table("fake", result)


def test_no_config_counts_when_every_peer_is_wrong(tmp_path: Path) -> None:
    with fake_servers() as port:
        setup = _setup(port, [Load(2, 1)])
        peer = FakePeer(port, {"bs16-bfloat16": "wrong"})
        result = side_by_side.run_peer(
            peer, side_by_side.configs([16], ["bfloat16"]), setup, tmp_path
        )
    assert result["best_config"] is None and result["rows"] == []
    assert "no configuration counted" in side_by_side.table("fake", result)


def test_check_texts_include_the_longest() -> None:
    texts = [f"t{i}" for i in range(20)]
    lengths = [5] * 20
    lengths[7], lengths[13] = 900, 700
    picked = side_by_side.check_texts_of(texts, lengths, 8)
    assert picked[:2] == ["t7", "t13"] and len(picked) == 8 and len(set(picked)) == 8
