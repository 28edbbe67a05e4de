"""One request's path through the gateway, for every route: authorize, read, turn the
body into a job (the route's part), admit, enqueue, wait, answer (the route's part
again), with the same metrics and headers. The handlers in ``gateway.app`` are one line
each on top of this."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from embedder.core import tracing
from embedder.core.adapters import AdapterCatalog
from embedder.core.errors import (
    DeadlineExceeded,
    FlotillaError,
    InvalidRequest,
    LimitExceeded,
    NotReady,
    Unauthorized,
)
from embedder.core.fleet import FleetView
from embedder.core.jobs import Job, JobResult, LoadsOnDemand, ModelStates
from embedder.core.rawjson import check_depth
from embedder.queue import JobSubmitter
from embedder.tasks.registry import kind_of_shape
from gateway import metrics
from gateway.admission import Admission
from gateway.annotate import annotate
from gateway.config import GatewayConfig
from gateway.errors import BodyTimeout, ClientGone
from gateway.keys import bearer_token, known_key

log = logging.getLogger(__name__)


class Route(Protocol):
    """A route's own part of the request path; ``Gateway.handle`` does the rest."""

    async def job(self, gateway: Gateway, request: Request, body: bytes, now: float) -> Job:
        """The annotated job for a request body (the body is only partly parsed)."""
        ...

    async def respond(self, job: Job, result: JobResult) -> JobResult:
        """The response to send for the worker's result (most routes send it as is)."""
        ...


@runtime_checkable
class StreamingRoute(Protocol):
    """A route that may answer in parts (generation's server-sent events)."""

    def streams(self, job: Job) -> bool:
        """Whether this job's client asked for a stream."""
        ...

    async def stream(self, gateway: Gateway, request: Request, job: Job) -> Response:
        """Admit, enqueue and answer the job in parts as the worker sends them."""
        ...


class ShapeRoute:
    """A route in one API's shape (OpenAI, TEI, Cohere): the gateway only annotates the
    body, the worker decodes it and writes the response, sent as it comes."""

    def __init__(self, shape: str) -> None:
        self.shape = shape
        self.kind = kind_of_shape(shape)  # once, not per request

    async def job(self, gateway: Gateway, request: Request, body: bytes, now: float) -> Job:
        return annotate(
            body,
            self.shape,
            self.kind,
            gateway.fleet,
            now=now,
            timeout_s=gateway.timeout_s(request),
            bytes_per_token=gateway.config.bytes_per_token,
            priority=gateway.priority(request),
            adapters=gateway.adapters,
        )

    async def respond(self, job: Job, result: JobResult) -> JobResult:
        return result


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        fleet: FleetView,
        queue: JobSubmitter,
        states: ModelStates,
        *,
        clock: Callable[[], float] = time.time,
        adapters: AdapterCatalog | None = None,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.adapters = adapters or AdapterCatalog(fleet)
        self.queue = queue
        self.states = states
        self.clock = clock
        self.admission = Admission(config.limits.max_inflight_tokens, clock=clock)

    async def handle(self, request: Request, route: Route) -> Response:
        # The route's template, not the path: /v1/collections/{name}/search is one label.
        path = getattr(request.scope.get("route"), "path", request.url.path)
        start = self.clock()
        model = "unknown"
        status = 500
        with tracing.request(request.method, path):  # off: one shared no-op
            try:
                self.authorize(request)
                body = await self.read_body(request)
                check_depth(body)  # before anything decodes it: a decoder recurses per level
                job = await route.job(self, request, body, start)
                model = job.model
                self.check_ready(model, job.deadline)
                if isinstance(route, StreamingRoute) and route.streams(job):
                    # Counted when its first part is out: the request time is the first token's.
                    response = await route.stream(self, request, job)
                    status = 200
                    return response
                result = await route.respond(job, await self.run(request, job))
                status = 200
            except ClientGone as exc:
                status = exc.http_status
                log.debug("%s %s: %s", request.method, request.url.path, exc.message)
                raise
            except FlotillaError as exc:
                status = exc.http_status
                raise
            finally:
                elapsed = self.clock() - start
                metrics.REQUESTS.labels(model, path, str(status)).inc()
                if status == 200:
                    metrics.REQUEST_SECONDS.labels(model, path).observe(elapsed)
        metrics.QUEUE_SECONDS.labels(model).observe(result.timings.queue_s)
        headers = {
            "x-request-id": job.id,
            "x-model": model,
            "x-queue-time": f"{result.timings.queue_s * 1e3:.2f}",
            "x-inference-time": f"{result.timings.inference_s * 1e3:.2f}",
            "x-total-time": f"{elapsed * 1e3:.2f}",
            "x-prompt-tokens": str(result.prompt_tokens),
            **result.extra_headers,
        }
        return Response(content=result.body, media_type=result.media_type, headers=headers)

    async def run(self, request: Request, job: Job) -> JobResult:
        with self.admission.admit(job.model, job.est_tokens):
            metrics.INFLIGHT_TOKENS.labels(job.model).inc(job.est_tokens)
            try:
                future = await self.queue.put(tracing.enqueuing(job))
                return await self.wait(request, job, future)
            finally:
                metrics.INFLIGHT_TOKENS.labels(job.model).dec(job.est_tokens)

    async def wait(
        self, request: Request, job: Job, future: asyncio.Future[JobResult]
    ) -> JobResult:
        """The job's result, unless the client leaves or the deadline passes first;
        either way the job is withdrawn so no worker spends time on it."""
        gone: asyncio.Future[None] = asyncio.ensure_future(_disconnected(request))
        waiting: set[asyncio.Future[Any]] = {future, gone}
        try:
            done, _ = await asyncio.wait(
                waiting,
                timeout=max(0.0, job.deadline - self.clock()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            gone.cancel()
            # Also when this task itself is cancelled (server shutdown, a cancelling server
            # or middleware): a result nobody awaits must not cost a forward pass.
            if not future.done():
                future.cancel()
        if future in done:
            return future.result()
        if gone in done:
            raise ClientGone("the client closed the connection; the job was withdrawn")
        raise DeadlineExceeded(
            f"no result within {job.budget_s:.1f} s: retry, send a longer "
            "x-request-timeout-ms, or raise --request-timeout-s (FLOTILLA_REQUEST_TIMEOUT_S)"
        )

    # -- request checks ---------------------------------------------------

    def authorize(self, request: Request) -> None:
        keys = self.config.limits.api_keys
        if not keys:
            return
        if not known_key(bearer_token(request.headers.get("authorization", "")), keys):
            raise Unauthorized("missing or unknown API key: send 'Authorization: Bearer <key>'")

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.limits.max_body_bytes
        too_big = LimitExceeded(
            f"request body over {limit} bytes: split the request, or raise --max-body-bytes "
            "(FLOTILLA_MAX_BODY_BYTES)"
        )
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks: list[bytes] = []
        size = 0
        stream = aiter(request.stream())
        while True:
            try:
                async with asyncio.timeout(self.config.limits.body_timeout_s):
                    chunk = await anext(stream)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise BodyTimeout(
                    f"the request body stopped arriving: nothing for "
                    f"{self.config.limits.body_timeout_s:g} s after {size} bytes"
                    + (f" of {declared}" if declared is not None else "")
                    + ": send the whole body, or raise --body-timeout-s (FLOTILLA_BODY_TIMEOUT_S)"
                ) from None
            except ClientDisconnect:
                raise ClientGone(
                    f"the client left after sending {size} bytes of the body"
                ) from None
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        body = b"".join(chunks)
        if not body:
            raise InvalidRequest("the request body is empty; send a JSON object")
        return body

    def timeout_s(self, request: Request) -> float:
        limit = self.config.limits.request_timeout_s
        asked = request.headers.get("x-request-timeout-ms")
        if asked is None:
            return limit
        try:
            value = float(asked) / 1e3
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):  # nan and inf parse as floats
            raise InvalidRequest(
                f"x-request-timeout-ms must be a finite positive number of milliseconds, "
                f"got {asked!r}"
            )
        return min(value, limit)

    @staticmethod
    def priority(request: Request) -> int:
        raw = request.headers.get("x-priority", "0")
        try:
            return int(raw)
        except ValueError:
            raise InvalidRequest(f"x-priority must be an integer, got {raw!r}") from None

    def check_ready(self, model: str, deadline: float) -> None:
        """NotReady (503 with Retry-After) unless ``model`` can answer by ``deadline``;
        a host that loads models on demand is asked for it (and loads it) instead."""
        if isinstance(self.states, LoadsOnDemand):
            self.states.demand(model, deadline)
            return
        state = self.states.state(model)
        if state == "loading":
            # A view of remote workers says why none is heard (the broker is unreachable).
            reason = self.states.describe(model).get("reason")
            if reason:
                raise NotReady(f"model {model!r} has no live worker in view: {reason}")
            raise NotReady(f"model {model!r} is still loading; retry shortly")
        if state == "failed":
            why = self.states.describe(model).get("reason") or "failed to load; see the server log"
            raise NotReady(f"model {model!r}: {why}", retry_after_s=60)


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
