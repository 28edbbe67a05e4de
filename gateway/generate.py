"""The generation routes' own part: annotating a chat or completion body, and streaming
its answer as server-sent events.

A generation job is sized by what it holds in the worker's KV cache: the estimated
prompt tokens (from the body's size, at most the model's window) plus the new tokens it
may make, so admission and the worker's KV budget count the same thing. A streamed
answer starts only once the worker sent its first part (the prompt is in), so a request
the worker refuses (a prompt over the window, say) still gets its status and error
body; after that, parts flow as the worker sends them and a client that leaves
withdraws the job, which stops its sequence at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from embedder.core import tracing
from embedder.core.errors import DeadlineExceeded, FlotillaError, InvalidRequest
from embedder.core.fleet import FleetView, entry_as
from embedder.core.jobs import Job, JobResult, Task
from embedder.core.rawjson import decode_struct, estimate_tokens
from embedder.queue import JobSubmitter, Partial, ReplyStream, StreamingSubmitter
from embedder.tasks.generate.requests import Routing, check_n, max_new_tokens
from embedder.tasks.generate.spec import GenerateSpec
from gateway import metrics
from gateway.admission import Admission
from gateway.annotate import model_for, requested
from gateway.config import GatewayConfig
from gateway.errors import ClientGone


class Gateway(Protocol):
    """What of ``gateway.service.Gateway`` the generation routes use."""

    fleet: FleetView
    config: GatewayConfig
    admission: Admission
    clock: Callable[[], float]

    queue: JobSubmitter

    def timeout_s(self, request: Request) -> float: ...

    def priority(self, request: Request) -> int: ...


class GenerateRoute:
    """/v1/chat/completions and /v1/completions: a job sized for the KV cache."""

    def __init__(self, shape: str) -> None:
        self.shape = shape
        self._streams: set[str] = set()  # job ids whose client asked for a stream

    async def job(self, gateway: Gateway, request: Request, body: bytes, now: float) -> Job:
        fields = decode_struct(body, Routing)
        check_n(fields.n)
        model, adapter = requested(fields.model, fields.adapter)
        spec = model_for(gateway.fleet, model, Task.GENERATE, "generate text")
        if adapter is not None:
            raise InvalidRequest(
                f"model {spec.name!r} serves no adapters: generation runs base models only"
            )
        bytes_per_token = gateway.config.bytes_per_token
        prompt = estimate_tokens(body, bytes_per_token, spec.max_tokens)
        new = max_new_tokens(fields) or entry_as(spec, GenerateSpec).max_new_tokens
        job = Job.new(
            spec.name,
            self.shape,
            body,
            now=now,
            timeout_s=gateway.timeout_s(request),
            bytes_per_token=bytes_per_token,
            priority=gateway.priority(request),
            est_tokens=min(prompt, spec.max_tokens) + new,
        )
        if fields.stream:
            self._streams.add(job.id)
        return job

    def streams(self, job: Job) -> bool:
        if job.id in self._streams:
            self._streams.discard(job.id)
            return True
        return False

    async def respond(self, job: Job, result: JobResult) -> JobResult:
        return result

    async def stream(self, gateway: Gateway, request: Request, job: Job) -> Response:
        return await stream(gateway, request, job)


async def stream(gateway: Gateway, request: Request, job: Job) -> Response:
    """Admit the job, wait for its first part, then answer with the parts as they come.
    Errors before the first part are raised (the usual error answer)."""
    held = contextlib.ExitStack()
    held.enter_context(gateway.admission.admit(job.model, job.est_tokens))
    metrics.INFLIGHT_TOKENS.labels(job.model).inc(job.est_tokens)
    held.callback(metrics.INFLIGHT_TOKENS.labels(job.model).dec, job.est_tokens)
    try:
        job = tracing.enqueuing(job)
        queue = gateway.queue
        if isinstance(queue, StreamingSubmitter):
            replies = await queue.put_streaming(job)
        else:  # a substrate that carries no parts yet: the whole stream comes at the end
            replies = ReplyStream(await queue.put(job))
        held.callback(replies.cancel)  # the client left or the stream ended: withdraw
        first = await _next(gateway, request, job, replies)
    except BaseException:
        held.close()
        raise
    headers = {"x-request-id": job.id, "x-model": job.model, "cache-control": "no-cache"}
    return _EventStream(
        _events(gateway, job, replies, first, held),
        held,
        media_type="text/event-stream",
        headers=headers,
    )


class _EventStream(StreamingResponse):
    """A stream that lets go of its job and admission however it ends: also when the
    client leaves before the first event is sent, and the events never start."""

    def __init__(
        self, content: AsyncIterator[bytes], held: contextlib.ExitStack, **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._held.close()  # a no-op when the events closed it already


async def _next(
    gateway: Gateway, request: Request, job: Job, replies: ReplyStream
) -> Partial | JobResult:
    """The next part before the deadline, unless the client leaves first."""
    step = asyncio.ensure_future(replies.next())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {step, gone},
            timeout=max(0.0, job.deadline - gateway.clock()),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        gone.cancel()
        if not step.done():
            step.cancel()
    if step in done:
        return step.result()
    if gone in done:
        raise ClientGone("the client closed the connection; the job was withdrawn")
    raise _past_deadline(job)


def _past_deadline(job: Job) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"no answer within {job.budget_s:.1f} s: send a longer "
        "x-request-timeout-ms, or raise --request-timeout-s (FLOTILLA_REQUEST_TIMEOUT_S)"
    )


async def _events(
    gateway: Gateway,
    job: Job,
    replies: ReplyStream,
    first: Partial | JobResult,
    held: contextlib.ExitStack,
) -> AsyncIterator[bytes]:
    # Starlette cancels this generator when the client disconnects: the ExitStack then
    # withdraws the job and releases its admission.
    with held:
        event = first
        while True:
            if isinstance(event, JobResult):
                metrics.QUEUE_SECONDS.labels(job.model).observe(event.timings.queue_s)
                yield event.body
                return
            yield event.body
            try:
                async with asyncio.timeout(max(0.0, job.deadline - gateway.clock())):
                    event = await replies.next()
            except (FlotillaError, TimeoutError) as exc:
                error = exc if isinstance(exc, FlotillaError) else _past_deadline(job)
                body = {"error": {"message": error.message, "type": error.code}}
                yield b"data: " + orjson.dumps(body) + b"\n\n"
                return


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
