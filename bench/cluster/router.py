"""The push baseline: a top-down HTTP router in front of worker processes.

Each request is assigned to one worker by a policy and forwarded there as it came
(body untouched, the worker's answer passed back). The policies
(``bench.cluster.policies``: ``rr``, ``least``, ``p2c``, ``least+own``, the
simulation's push policies run for real) read a *view* of the workers' load: every
worker's outstanding tokens (the gateway's ``flotilla_inflight_tokens``: admitted
and not yet answered, so queued plus running), polled from its ``/metrics`` every R
ms and stale in between, the way a load balancer fed by periodic load reports sees
its backends. ``rr`` reads no view, so the router polls nothing for it.

Several routers in front of the same workers (gateway replicas) are several processes:
each counts only its own sends (``least+own``) and polls on its own phase (after the
poll at start, the cadence begins ``--phase-ms`` later, by default drawn by its seed
within one period), so their views are taken at different instants.
``--report-delay-ms`` delays applying each poll's snapshot: the view a router places by
was taken that long ago, as when load reports reach a balancer through a collector.

With a hosting map (``--hosting '{"model": [0, 2], ...}'``: worker indices per model)
the router reads each request's ``model`` field and the policy chooses among the workers
that host it only (round-robin keeps one turn per model); a model the map does not name
goes to any worker.

    python -m bench.cluster.router --worker URL --worker URL [--policy least] [--refresh-ms 50]
        [--phase-ms MS] [--report-delay-ms 0] [--hosting JSON] [--port 8090]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from bench.cluster.policies import (
    VIEW_POLICIES,
    Policy,
    Routing,
    least_loaded,
    least_with_own,
    power_of_two,
    round_robin,
)
from embedder.core.lifecycle import cancel_and_wait

log = logging.getLogger(__name__)

LOAD_METRIC = "flotilla_inflight_tokens"
# What a client may say to a worker, and what the worker says back, besides the body.
REQUEST_HEADERS = ("content-type", "authorization", "x-request-timeout-ms", "x-priority")
RESPONSE_HEADERS = (
    "content-type", "retry-after", "x-request-id", "x-model", "x-queue-time",
    "x-inference-time", "x-total-time", "x-prompt-tokens",
)  # fmt: skip
POLL_TIMEOUT_S = 2.0
# What --policy takes: the pickers of bench.cluster.policies.
POLICIES: dict[str, Policy] = {
    "rr": round_robin,
    "least": least_loaded,
    "p2c": power_of_two,
    "least+own": least_with_own,
}


def outstanding_tokens(metrics_text: str) -> float:
    """The worker's outstanding tokens, summed over models, from its /metrics text."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(LOAD_METRIC + "{") or line.startswith(LOAD_METRIC + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class RouterStats:
    requests: list[int]
    tokens: list[int]
    upstream_errors: int = 0
    polls: int = 0
    poll_failures: int = 0
    poll_s: float = 0.0
    view_age_s: float = 0.0  # summed over placed requests
    by_status: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        placed = sum(self.requests)
        return {
            "requests": self.requests,
            "tokens": self.tokens,
            "upstream_errors": self.upstream_errors,
            "by_status": self.by_status,
            "polls": self.polls,
            "poll_failures": self.poll_failures,
            "mean_poll_ms": 1e3 * self.poll_s / self.polls if self.polls else None,
            "mean_view_age_ms": 1e3 * self.view_age_s / placed if placed else None,
        }


class Router:
    def __init__(
        self,
        workers: Sequence[str],
        policy: str,
        refresh_ms: float,
        *,
        bytes_per_token: float = 4.0,
        seed: int = 0,
        hosting: dict[str, list[int]] | None = None,
        phase_ms: float | None = None,
        report_delay_ms: float = 0.0,
    ) -> None:
        if not workers:
            raise ValueError("the router needs at least one worker")
        self.hosting = {m: sorted(set(ws)) for m, ws in (hosting or {}).items()}
        if any(not ws or min(ws) < 0 or max(ws) >= len(workers) for ws in self.hosting.values()):
            raise ValueError("every hosted model needs workers among the router's")
        self._turns: dict[str, int] = {}  # round-robin turn per hosted model
        self.workers = [url.rstrip("/") for url in workers]
        self.policy_name = policy
        self.policy = POLICIES[policy]
        self.refresh_s = refresh_ms / 1e3
        self.bytes_per_token = bytes_per_token
        self.rng = random.Random(seed)
        if report_delay_ms < 0 or (phase_ms is not None and phase_ms < 0):
            raise ValueError("phase_ms and report_delay_ms must not be negative")
        self.phase_s = self.rng.uniform(0, self.refresh_s) if phase_ms is None else phase_ms / 1e3
        self.report_delay_s = report_delay_ms / 1e3
        self._pending: set[asyncio.TimerHandle] = set()  # snapshots not applied yet
        n = len(self.workers)
        self.routing = Routing(n, [0.0] * n, [0] * n)
        self.stats = RouterStats([0] * n, [0] * n)
        self._sent = [0] * n  # tokens ever sent, per worker
        self._view_at = time.monotonic()
        self._ready = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None

    @property
    def polls(self) -> bool:
        return self.policy_name in VIEW_POLICIES

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def start(self) -> None:
        if self._session is not None:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
        )
        if self.polls:
            self._poller = asyncio.create_task(self._poll_loop(), name="router-poll")
        else:
            self._ready.set()

    async def stop(self) -> None:
        poller, self._poller = self._poller, None
        await cancel_and_wait(poller)
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- the view ------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        loop = asyncio.get_running_loop()
        await self._poll()  # the first view at once; then the cadence from its own phase
        await asyncio.sleep(self.phase_s)
        next_at = loop.time()
        while True:
            await self._poll()
            # A fixed cadence: a slow poll shortens the wait, never stacks polls up.
            next_at = max(next_at + self.refresh_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _poll(self) -> None:
        assert self._session is not None
        started, marker = time.monotonic(), list(self._sent)
        try:
            async with asyncio.timeout(POLL_TIMEOUT_S):
                loads = await asyncio.gather(*(self._load(url) for url in self.workers))
        except (aiohttp.ClientError, TimeoutError, ValueError, IndexError) as exc:
            self.stats.poll_failures += 1
            log.warning("polling the workers failed: %r", exc)
            return
        self.stats.polls += 1
        self.stats.poll_s += time.monotonic() - started
        if self.report_delay_s <= 0:
            self._apply(list(loads), marker, started)
            return

        def apply_late() -> None:
            self._pending.discard(handle)
            self._apply(list(loads), marker, started)

        # Equal delays keep the snapshots in the order they were taken.
        handle = asyncio.get_running_loop().call_later(self.report_delay_s, apply_late)
        self._pending.add(handle)

    def _apply(self, loads: list[float], marker: list[int], taken: float) -> None:
        """The whole view changes at once: one snapshot, as the simulated router has; its
        own sends count from the instant the snapshot was taken."""
        self.routing.view = loads
        self.routing.sent_since_view = [s - m for s, m in zip(self._sent, marker, strict=True)]
        self._view_at = taken
        self._ready.set()

    async def _load(self, url: str) -> float:
        assert self._session is not None
        async with self._session.get(f"{url}/metrics") as response:
            response.raise_for_status()
            return outstanding_tokens(await response.text())

    # -- placing and forwarding ---------------------------------------------------------

    def place(self, tokens: int, model: str | None = None) -> int:
        hosts = self.hosting.get(model) if model is not None else None
        if hosts is None:
            i = self.policy(self.routing, self.rng)
        else:  # the same policy over the model's hosts only
            r = self.routing
            turn = self._turns.get(model or "", 0)
            self._turns[model or ""] = turn + 1
            sub = Routing(len(hosts), [r.view[h] for h in hosts],
                          [r.sent_since_view[h] for h in hosts], turn)  # fmt: skip
            i = hosts[self.policy(sub, self.rng)]
        self.routing.turn += 1
        self.routing.sent_since_view[i] += tokens
        self._sent[i] += tokens
        self.stats.requests[i] += 1
        self.stats.tokens[i] += tokens
        self.stats.view_age_s += time.monotonic() - self._view_at
        return i

    async def forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        body = await request.read()
        model = _model_of(body) if self.hosting else None
        i = self.place(max(1, math.ceil(len(body) / self.bytes_per_token)), model)
        headers = {k: request.headers[k] for k in REQUEST_HEADERS if k in request.headers}
        try:
            async with self._session.post(
                self.workers[i] + request.path_qs, data=body, headers=headers
            ) as response:
                payload = await response.read()
                status = response.status
                passed = {k: response.headers[k] for k in RESPONSE_HEADERS if k in response.headers}
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.stats.upstream_errors += 1
            return web.json_response(
                {"error": f"worker {i} failed: {exc!r}", "error_type": "bad_gateway"}, status=502
            )
        self.stats.by_status[str(status)] = self.stats.by_status.get(str(status), 0) + 1
        return web.Response(status=status, body=payload, headers={**passed, "x-worker": str(i)})


def _model_of(body: bytes) -> str | None:
    try:
        model = json.loads(body).get("model")
    except (ValueError, AttributeError):
        return None
    return model if isinstance(model, str) else None


def build_app(router: Router) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def lifespan(_: web.Application) -> AsyncIterator[None]:
        await router.start()
        yield
        await router.stop()

    async def ready(_: web.Request) -> web.Response:
        """200 once the view is filled (at once for a policy that reads none)."""
        return web.json_response({"ready": router.ready}, status=200 if router.ready else 503)

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(
            {"policy": router.policy_name, "refresh_ms": 1e3 * router.refresh_s,
             "phase_ms": 1e3 * router.phase_s, "report_delay_ms": 1e3 * router.report_delay_s,
             "workers": router.workers, **router.stats.as_dict()}
        )  # fmt: skip

    app.cleanup_ctx.append(lifespan)
    app.router.add_get("/router/ready", ready)
    app.router.add_get("/router/stats", stats)
    app.router.add_post("/{path:.*}", router.forward)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster.router", description="A top-down HTTP router (push baseline)."
    )
    parser.add_argument("--worker", action="append", required=True, help="a worker's base URL")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="least")
    parser.add_argument("--refresh-ms", type=float, default=50.0, help="view refresh period R")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--bytes-per-token", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--phase-ms", type=float, default=None,
        help="the first poll this long after start (default: drawn by --seed within R)",
    )  # fmt: skip
    parser.add_argument(
        "--report-delay-ms", type=float, default=0.0,
        help="apply each poll's snapshot this long after it was taken (a stale report)",
    )  # fmt: skip
    parser.add_argument(
        "--hosting", type=json.loads, default=None,
        help='JSON: the worker indices that host each model, {"model": [0, 2]}',
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.refresh_ms <= 0:
        parser.error("--refresh-ms must be positive")
    logging.basicConfig(level=logging.WARNING)
    router = Router(
        args.worker,
        args.policy,
        args.refresh_ms,
        bytes_per_token=args.bytes_per_token,
        seed=args.seed,
        hosting=args.hosting,
        phase_ms=args.phase_ms,
        report_delay_ms=args.report_delay_ms,
    )
    web.run_app(build_app(router), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
