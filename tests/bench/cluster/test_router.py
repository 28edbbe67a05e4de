"""The push router: its policies on a view, the view parsed from /metrics, and forwarding
to fake workers whose load the test sets (so a stale view herds, as it should)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.cluster.policies import (
    Routing,
    least_loaded,
    least_with_own,
    power_of_two,
    round_robin,
)
from bench.cluster.router import POLICIES, Router, build_app, outstanding_tokens

METRICS = """\
# HELP flotilla_inflight_tokens Estimated tokens admitted.
# TYPE flotilla_inflight_tokens gauge
flotilla_inflight_tokens{model="a"} 120.0
flotilla_inflight_tokens{model="b"} 30.0
# HELP flotilla_inflight_tokens_other Something else.
flotilla_inflight_tokens_other{model="a"} 999.0
flotilla_queue_depth{model="a"} 7.0
"""


def test_outstanding_tokens_sums_the_gauge_over_models_and_nothing_else() -> None:
    assert outstanding_tokens(METRICS) == 150.0
    assert outstanding_tokens("flotilla_inflight_tokens 5.0\n") == 5.0
    assert outstanding_tokens("") == 0.0


def test_round_robin_cycles_and_ignores_the_view() -> None:
    rng = random.Random(0)
    picks = []
    for turn in range(6):
        picks.append(round_robin(Routing(3, [0.0, 1e9, 0.0], [0, 0, 0], turn), rng))
    assert picks == [0, 1, 2, 0, 1, 2]


def test_least_takes_the_lowest_view_and_breaks_ties_at_random() -> None:
    rng = random.Random(0)
    assert least_loaded(Routing(3, [50.0, 10.0, 30.0], [0, 0, 0]), rng) == 1
    ties = Counter(least_loaded(Routing(3, [5.0, 9.0, 5.0], [0, 0, 0]), rng) for _ in range(400))
    assert set(ties) == {0, 2} and min(ties.values()) > 120


def test_least_plus_own_counts_what_the_router_sent_since_the_view() -> None:
    rng = random.Random(0)
    routing = Routing(2, [10.0, 20.0], [15, 0])
    assert least_loaded(routing, rng) == 0  # the view alone
    assert least_with_own(routing, rng) == 1  # 25 > 20 once its own sends count


def test_power_of_two_takes_the_lesser_of_two_distinct_workers() -> None:
    rng = random.Random(0)
    view = [0.0, 10.0, 20.0, 30.0]
    picks = Counter(power_of_two(Routing(4, view, [0] * 4), rng) for _ in range(2000))
    assert 3 not in picks  # the busiest is never the lesser of two distinct
    assert picks[0] > picks[1] > picks[2] > 0
    # With two workers both are always drawn: p2c is least.
    assert all(power_of_two(Routing(2, [5.0, 1.0], [0, 0]), rng) == 1 for _ in range(50))


@dataclass
class FakeWorker:
    """/metrics reports ``load``; each POST is answered with which worker took it."""

    name: str
    load: float = 0.0
    bodies: list[bytes] = field(default_factory=list)
    polls: int = 0

    def app(self) -> web.Application:
        async def metrics(_: web.Request) -> web.Response:
            self.polls += 1
            return web.Response(text=f'flotilla_inflight_tokens{{model="m"}} {self.load}\n')

        async def embed(request: web.Request) -> web.Response:
            self.bodies.append(await request.read())
            return web.json_response(
                {"worker": self.name, "path": request.path},
                headers={"x-queue-time": "1.5", "x-internal": "no"},
            )

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/{path:.*}", embed)
        return app


@pytest.fixture
async def workers() -> AsyncIterator[tuple[list[FakeWorker], list[str]]]:
    fakes = [FakeWorker("w0"), FakeWorker("w1")]
    servers = [TestServer(w.app()) for w in fakes]
    for server in servers:
        await server.start_server()
    try:
        yield fakes, [str(server.make_url("")) for server in servers]
    finally:
        for server in servers:
            await server.close()


@contextlib.asynccontextmanager
async def routed(router: Router) -> AsyncIterator[Callable[[int], Awaitable[list[str]]]]:
    """The router's app on a test server; yields ``send(n)``: n requests, in turn, and
    which worker answered each."""
    server = TestServer(build_app(router))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with asyncio.timeout(5):  # the view fills on the first poll
                while True:
                    async with session.get(server.make_url("/router/ready")) as response:
                        if response.status == 200:
                            break
                    await asyncio.sleep(0.01)

            async def send(count: int) -> list[str]:
                taken = []
                for i in range(count):
                    url = server.make_url("/v1/embeddings")
                    async with session.post(url, data=f'{{"input": ["x{i}"]}}') as response:
                        assert response.status == 200
                        assert response.headers["x-queue-time"] == "1.5"
                        assert "x-internal" not in response.headers
                        body = await response.json()
                        assert body["path"] == "/v1/embeddings"
                        assert response.headers["x-worker"] == body["worker"][1:]
                        taken.append(body["worker"])
                return taken

            yield send
    finally:
        await server.close()


async def test_round_robin_forwards_alternately_and_never_polls(
    workers: tuple[list[FakeWorker], list[str]],
) -> None:
    fakes, urls = workers
    router = Router(urls, "rr", refresh_ms=10)
    async with routed(router) as send:
        assert await send(6) == ["w0", "w1"] * 3
    assert [w.polls for w in fakes] == [0, 0]
    assert [len(w.bodies) for w in fakes] == [3, 3]
    assert fakes[0].bodies[0] == b'{"input": ["x0"]}'  # forwarded untouched
    assert router.stats.requests == [3, 3]


async def test_least_on_a_stale_view_sends_everything_to_the_worker_that_looked_idle(
    workers: tuple[list[FakeWorker], list[str]],
) -> None:
    fakes, urls = workers
    fakes[0].load, fakes[1].load = 5_000.0, 100.0
    # A view that is never refreshed during the test: the herd goes to w1.
    router = Router(urls, "least", refresh_ms=60_000)
    async with routed(router) as send:
        assert await send(8) == ["w1"] * 8
    assert router.stats.polls == 1


async def test_least_plus_own_spreads_what_a_stale_view_would_herd(
    workers: tuple[list[FakeWorker], list[str]],
) -> None:
    fakes, urls = workers
    fakes[0].load = fakes[1].load = 0.0
    router = Router(urls, "least+own", refresh_ms=60_000)
    async with routed(router) as send:
        taken = await send(8)
    assert Counter(taken) == {"w0": 4, "w1": 4}  # equal bodies: its own counts alternate


async def test_a_fresh_view_follows_the_load(
    workers: tuple[list[FakeWorker], list[str]],
) -> None:
    fakes, urls = workers
    fakes[0].load, fakes[1].load = 100.0, 5_000.0
    router = Router(urls, "least", refresh_ms=5)
    async with routed(router) as send:
        assert set(await send(3)) == {"w0"}
        fakes[0].load, fakes[1].load = 5_000.0, 100.0
        polls = router.stats.polls
        async with asyncio.timeout(5):  # until a poll that began after the change is in
            while router.stats.polls < polls + 2:  # noqa: ASYNC110 - a counter
                await asyncio.sleep(0.005)
        assert set(await send(3)) == {"w1"}
    assert router.stats.poll_failures == 0


def test_every_policy_is_registered() -> None:
    assert set(POLICIES) == {"rr", "least", "p2c", "least+own"}


def test_each_router_polls_on_its_own_phase_within_one_period() -> None:
    urls = ["http://w0", "http://w1"]
    phases = {Router(urls, "least", 1000, seed=s).phase_s for s in range(8)}
    assert len(phases) == 8 and all(0 <= p < 1.0 for p in phases)
    assert (
        Router(urls, "least", 1000, seed=3).phase_s == Router(urls, "least", 1000, seed=3).phase_s
    )
    assert Router(urls, "least", 1000, phase_ms=250).phase_s == 0.25
    with pytest.raises(ValueError):
        Router(urls, "least", 1000, report_delay_ms=-1)


async def test_a_report_delay_keeps_the_router_on_the_old_view_that_long(
    workers: tuple[list[FakeWorker], list[str]],
) -> None:
    fakes, urls = workers
    fakes[0].load, fakes[1].load = 100.0, 5_000.0
    router = Router(urls, "least", refresh_ms=10, phase_ms=0, report_delay_ms=400)
    async with routed(router) as send:
        assert set(await send(2)) == {"w0"}
        fakes[0].load, fakes[1].load = 5_000.0, 100.0
        polls = router.stats.polls
        async with asyncio.timeout(5):  # polls that saw the change are in, not yet applied
            while router.stats.polls < polls + 3:  # noqa: ASYNC110 - a counter
                await asyncio.sleep(0.005)
        assert set(await send(2)) == {"w0"}
        await asyncio.sleep(0.6)  # past the delay: the new view is applied
        assert set(await send(2)) == {"w1"}
