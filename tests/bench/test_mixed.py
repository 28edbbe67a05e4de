"""bench.mixed's arithmetic and arguments: the ratios are each load's p99 with the other
running over its p99 alone; an open loop keeps its offered rate whatever the answers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench import mixed


def row(phase: str, embed_p99: float | None, itl_p99: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"phase": phase}
    if embed_p99 is not None:
        out["embed"] = {"latency_ms": {"p99": embed_p99}}
    if itl_p99 is not None:
        out["chat"] = {m: {"p99": itl_p99} for m in ("ttft_ms", "itl_ms", "tpot_ms")}
    return out


def test_ratios_divide_each_load_under_the_other_by_itself_alone() -> None:
    rows = [row("embed", 50, None), row("chat", None, 100), row("both", 150, 120)]
    got = mixed.ratios(rows)
    assert got["embed_latency_p99"] == pytest.approx(3.0)
    assert got["chat_itl_p99"] == pytest.approx(1.2)
    assert mixed.ratios(rows[:2]) == {}  # no mixed phase, nothing to compare


def test_phases_are_checked() -> None:
    assert mixed.parse_args(["--phases", "embed,both"]).phases == ["embed", "both"]
    with pytest.raises(SystemExit):
        mixed.parse_args(["--phases", "embed,lunch"])
    with pytest.raises(SystemExit):
        mixed.parse_args(["--embed-rate", "0"])


async def test_the_open_loop_keeps_its_rate_and_times_from_the_planned_send() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.2)
        return web.json_response({}, headers={"x-queue-time": "1", "x-inference-time": "2"})

    app = web.Application()
    app.router.add_post("/v1/embeddings", slow)
    async with TestServer(app) as server:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            started = time.perf_counter()
            load = await mixed.embed_open_loop(
                session, str(server.make_url("/v1/embeddings")), [b"{}"], rate=20, duration_s=0.5
            )
            elapsed = time.perf_counter() - started
    # 20/s for 0.5 s is 10 sends whatever the 0.2 s answers: a closed loop would send ~3.
    assert load.sent == 10 and len(load.latencies_ms) == 10
    assert min(load.latencies_ms) >= 200 and elapsed < 1.5
    assert load.queue_ms == [1.0] * 10 and load.inference_ms == [2.0] * 10
