"""The streaming client against a tiny SSE server started here: what it parses,
how it times the first token and the gaps, and what it does with bad streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from bench.generation.client import SseParser, Stream, stream_once
from bench.generation.load import Target, run_level, summarize
from bench.generation.prompts import PROMPTS, Prompt

FIRST_S = 0.15  # the fake server's delay before its first token
GAP_S = 0.08  # and between tokens
BODIES = web.AppKey("bodies", list)
STATE = web.AppKey("state", dict)


def _event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunk(content: str | None, **extra: object) -> dict[str, object]:
    delta = {} if content is None else {"content": content}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}], **extra}


async def _stream(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[BODIES].append(body)
    app_state = request.app[STATE]
    app_state["active"] += 1
    app_state["peak"] = max(app_state["peak"], app_state["active"])
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    try:
        await response.write(_event(_chunk("", role="assistant")))  # not a token
        await response.write(b": keep-alive comment\n\n")
        await asyncio.sleep(FIRST_S)
        first = _event(_chunk("Hel"))
        await response.write(first[:9])  # an event split across writes
        await asyncio.sleep(0.01)
        await response.write(first[9:])
        for token in ("lo", " world"):
            await asyncio.sleep(GAP_S)
            await response.write(_event(_chunk(token)).replace(b"\n\n", b"\r\n\r\n"))
        if request.path == "/usage":
            usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
            await response.write(_event({"choices": [], "usage": usage}))
        if request.path != "/no-done":
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    finally:
        app_state["active"] -= 1
    return response


async def _broken(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: {not json\n\n")
    await response.write_eof()
    return response


async def _busy(request: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "over budget"}}, status=429)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, web.Application]]:
    app = web.Application()
    app[BODIES] = []
    app[STATE] = {"active": 0, "peak": 0}
    for path in ("/usage", "/no-usage", "/no-done"):
        app.router.add_post(path, _stream)
    app.router.add_post("/broken", _broken)
    app.router.add_post("/busy", _busy)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", app
    await runner.cleanup()


Once = Callable[[str], Awaitable[Stream]]


@pytest.fixture
async def once(server: tuple[str, web.Application]) -> AsyncIterator[Once]:
    base, _ = server
    async with aiohttp.ClientSession() as session:

        async def send(path: str) -> Stream:
            return await stream_once(session, base + path, {"model": "m"}, timeout_s=10)

        yield send


async def test_first_token_gaps_and_usage_are_accounted(once: Once) -> None:
    stream = await once("/usage")
    assert stream.ok, stream.error
    assert stream.text == "Hello world"
    # the role chunk and the comment are not tokens: TTFT waits for "Hel"
    assert stream.ttft_s is not None and FIRST_S <= stream.ttft_s < FIRST_S + 0.5
    assert len(stream.chunk_times_s) == 3
    assert all(GAP_S * 0.9 <= gap < GAP_S + 0.5 for gap in stream.gaps_s)
    assert (stream.prompt_tokens, stream.completion_tokens, stream.output_tokens) == (7, 3, 3)
    tpot = stream.time_per_output_token_s
    assert tpot is not None and GAP_S * 0.9 <= tpot < GAP_S + 0.5


async def test_without_usage_tokens_are_the_text_chunks(once: Once) -> None:
    stream = await once("/no-usage")
    assert stream.ok and stream.completion_tokens is None and stream.output_tokens == 3
    row = summarize([stream], clients=1)
    assert row["usage_missing"] == 1 and row["output_tokens"] == 3


async def test_bad_streams_are_errors_not_exceptions(once: Once) -> None:
    no_done = await once("/no-done")
    assert not no_done.ok and "[DONE]" in (no_done.error or "")
    assert no_done.text == "Hello world"  # what arrived is kept
    broken = await once("/broken")
    assert not broken.ok and "JSONDecodeError" in (broken.error or "")
    busy = await once("/busy")
    assert (busy.ok, busy.status) == (False, 429) and "over budget" in (busy.error or "")
    row = summarize([no_done, broken, busy], clients=1)
    assert row["ok"] == 0 and sum(row["errors"].values()) == 3 and row["output_tokens"] == 0


async def test_closed_loop_clients_send_the_fixed_requests_in_order(
    server: tuple[str, web.Application],
) -> None:
    base, app = server
    prompts = [Prompt("a", 4), Prompt("b", 8), Prompt("c", 16)]
    target = Target("fake", base + "/usage", "m")
    streams = await run_level(target, clients=3, requests=7, timeout_s=10, prompts=prompts)
    assert len(streams) == 7 and all(s.ok for s in streams)
    assert app[STATE]["peak"] == 3  # three clients, never more in flight
    sent = sorted(app[BODIES], key=lambda b: b["messages"][0]["content"])
    assert [b["max_tokens"] for b in sent] == [4, 4, 4, 8, 8, 16, 16]
    for body in sent:
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["temperature"] == 0.0 and body["model"] == "m"
    row = summarize(streams, clients=3)
    assert row["output_tokens"] == 21 and row["ok"] == 7
    # 7 requests of >= FIRST_S + 2 GAP_S each over 3 clients: at least 3 rounds
    assert row["elapsed_s"] >= 3 * (FIRST_S + 2 * GAP_S)
    assert row["output_tokens_per_s"] == pytest.approx(21 / row["elapsed_s"], rel=1e-3)
    assert FIRST_S * 1e3 <= row["ttft_ms"]["p50"] <= row["ttft_ms"]["p99"]
    assert row["itl_ms"]["p50"] >= GAP_S * 0.9e3


def test_the_parser_takes_bytes_split_anywhere() -> None:
    stream = (
        b'data: {"a": 1}\n\n: comment\r\n\r\nevent: x\ndata: line1\ndata:line2\n\ndata: [DONE]\n\n'
    )
    whole = SseParser().feed(stream)
    assert whole == ['{"a": 1}', "line1\nline2", "[DONE]"]
    for cut in range(1, len(stream)):
        parser = SseParser()
        assert parser.feed(stream[:cut]) + parser.feed(stream[cut:]) == whole
    tail = SseParser()
    assert tail.feed(b"data: last") == [] and tail.close() == ["last"]


def test_summary_percentiles_over_streams() -> None:
    def stream(sent: float, chunks: tuple[float, ...], tokens: int) -> Stream:
        return Stream(sent, chunks[-1], 200, None, chunks, "x", tokens, 5)

    streams = [stream(0.0, (0.1, 0.2, 0.3), 3), stream(0.0, (0.5, 0.6, 1.0), 4)]
    row = summarize(streams, clients=2)
    assert row["elapsed_s"] == 1.0 and row["output_tokens_per_s"] == 7.0
    assert row["ttft_ms"] == {"p50": pytest.approx(100), "p99": pytest.approx(500)}
    assert row["itl_ms"]["p99"] == pytest.approx(400)  # gaps 100, 100, 100, 400
    assert row["mean_output_tokens"] == 3.5 and row["prompt_tokens_mean"] == 5


def test_every_prompt_is_a_greedy_streamed_chat_request() -> None:
    from bench.generation.prompts import body

    assert len({p.text for p in PROMPTS}) == len(PROMPTS)
    assert {p.max_tokens for p in PROMPTS} == {16, 32, 64, 128}
    request = body(PROMPTS[0], "m")
    assert request["messages"] == [{"role": "user", "content": PROMPTS[0].text}]
