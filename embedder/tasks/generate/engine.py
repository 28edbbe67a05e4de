"""The generation worker of one model: continuous batching on the pull substrate.

It pulls generation jobs while the KV budget has room (each sequence reserves its
prompt plus the new tokens it may make, so a running sequence never runs out of room)
and runs one *iteration* at a time, on the device thread, in two device turns (so another
loop's forward on the device waits for one of them, not both):

1. one decode step over every running sequence (one forward for the whole batch);
2. prefill of waiting prompts, at most ``prefill_chunk_tokens`` of them per iteration:
   short prompts together in one padded forward, a long one in chunks over several
   iterations, so the running streams keep getting a token each iteration meanwhile;
3. sequences that finished (end of sequence, a stop string, max_tokens, the window)
   leave the batch; prefilled ones join it.

Between iterations the loop delivers each sequence's new text (a partial chunk when it
streams), completes the finished ones, drops those whose client left or whose deadline
passed, and pulls more. One host thread, the device thread, runs the model and the
tokenizer: neither is safe to call from two threads at once.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

import embedder.tasks.generate.requests as requests
from embedder.core.errors import (
    ContextWindowExceeded,
    DeadlineExceeded,
    FlotillaError,
    InferenceFailed,
    TaskNotSupported,
)
from embedder.core.jobs import ApiShape, Job, JobResult, Timings
from embedder.core.lifecycle import Lifecycle, cancel_and_wait, running, watch
from embedder.queue import JobPuller, Partial, StreamingPuller
from embedder.serving import metrics
from embedder.serving.pulling import IDLE_POLL_S, fail_all, pull_or_pause, settle_departed
from embedder.serving.thread import OneThread
from embedder.serving.turns import DeviceTurns
from embedder.tasks.generate.kv import KVBatch, prefill, prefill_many, rows_of
from embedder.tasks.generate.replies import Reply
from embedder.tasks.generate.runtime import GenerationRuntime
from embedder.tasks.generate.sampling import Sampler
from embedder.tasks.generate.spec import GenerateSpec
from embedder.tasks.generate.text import TextSoFar

log = logging.getLogger(__name__)

# While sequences run, a pull must not hold up the next step; not 0: a distributed
# substrate's fetch needs a positive timeout. A step takes tens of milliseconds or more.
BUSY_POLL_S = 0.001
# The device thread needs the GIL between the hundreds of ops of a forward; while the event
# loop streams tokens it holds the GIL, and CPython hands it over only every switch
# interval (5 ms by default). Measured on the 2-core EPYC, 32 streamed clients in-process:
# 50 tok/s at 5 ms, 58 at 0.2 ms, 68 at 50 us (= the same clients not streamed).
SWITCH_INTERVAL_S = 50e-6


@dataclass(frozen=True, slots=True)
class GenerationLimits:
    kv_tokens: int  # the KV budget: prompts plus reserved new tokens of all sequences
    max_sequences: int
    prefill_chunk_tokens: int
    window: int  # the context window of one sequence
    default_new_tokens: int

    @classmethod
    def of(cls, spec: GenerateSpec, device: str) -> GenerationLimits:
        profile = spec.profile("cuda" if device.startswith("cuda") else "cpu")
        return cls(
            kv_tokens=profile.kv_tokens,
            max_sequences=profile.max_batch_requests,
            prefill_chunk_tokens=profile.prefill_chunk_tokens,
            window=spec.max_tokens,
            default_new_tokens=spec.max_new_tokens,
        )


@dataclass(eq=False)
class Sequence:
    """One request being generated."""

    job: Job
    reply: Reply
    prompt: list[int]
    max_new: int
    sampler: Sampler
    text: TextSoFar
    started: float  # when it left the queue
    cache: DynamicCache | None = None  # while prefilling
    prefilled: int = 0
    generated: list[int] = field(default_factory=list)
    finish: str | None = None
    out: bytes = b""  # to stream after this iteration
    sent: int = 0  # partials sent

    @property
    def reserved(self) -> int:
        return len(self.prompt) + self.max_new

    @property
    def streams(self) -> bool:
        return self.reply.request.stream


class GenerationEngine(Lifecycle):
    def __init__(
        self,
        queue: JobPuller,
        spec: GenerateSpec,
        runtime: GenerationRuntime,
        turns: DeviceTurns,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.queue = queue
        self.streams = queue if isinstance(queue, StreamingPuller) else None
        self.spec = spec
        self.name = spec.name
        self.runtime = runtime
        self.turns = turns
        self.clock = clock
        self.limits = GenerationLimits.of(spec, runtime.info.device)
        self.batch = KVBatch()
        self.rows: list[Sequence] = []  # row i of the batch
        self.prefilling: list[Sequence] = []
        self.pulled: list[Job] = []  # taken, waiting for room
        self.done_first: list[Sequence] = []  # finished by their first token
        self._device = OneThread("generate")
        self._task: asyncio.Task[None] | None = None
        self._owner = f"generate:{spec.name}"
        self._deadline = 0.0  # of the turn running now
        self._lending: list[torch.utils.hooks.RemovableHandle] = []

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            # Before each decoder block the forward lends the device to another loop that
            # waits (an embedding batch): it waits for a block, not for a whole step.
            layers = self.runtime.layers()
            self._lending = [layer.register_forward_pre_hook(self._lend) for layer in layers]
            self._task = watch(asyncio.create_task(self._loop(), name=f"generate-{self.name}"))

    def _lend(self, module: torch.nn.Module, args: object) -> None:
        self.turns.lend_point(self._owner, self._deadline)

    def running(self) -> bool:
        return running(self._task)

    async def stop(self) -> None:
        for hook in self._lending:
            hook.remove()
        self._lending = []
        task, self._task = self._task, None
        await cancel_and_wait(task)
        jobs = [s.job for s in (*self.rows, *self.prefilling)] + self.pulled
        self.rows, self.prefilling, self.pulled = [], [], []
        self.batch = KVBatch()
        self._device.close()
        await fail_all(self.queue, jobs, DeadlineExceeded("the worker stopped"))

    def in_hand(self) -> int:
        return len(self.rows) + len(self.prefilling) + len(self.pulled)

    @property
    def active(self) -> list[Sequence]:
        return [*self.rows, *self.prefilling]

    # -- the loop -------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            await self._admit()
            await self._drop_departed()
            if not self.active:
                continue
            deadline = self._deadline = min(s.job.deadline for s in self.active)
            owner = self._owner
            try:
                tokens = 0
                # Two turns, not one: a forward of the other loops (an embedding batch)
                # waits for a decode step or a prefill, never for both.
                parts = [(self._decode, self.rows), (self._prefill, self.prefilling)]
                for part in [part for part, work in parts if work]:
                    async with self.turns.turn(owner, deadline):
                        start = time.perf_counter()
                        tokens += await self._device.call(part)
                        elapsed = time.perf_counter() - start
                        metrics.INFERENCE_SECONDS.labels(self.name).observe(elapsed)
            except Exception as exc:  # a model failure fails its sequences, not the loop
                log.exception("generation step failed on %s", self.name)
                error = InferenceFailed(f"model {self.name!r} failed on this step: {exc!r}")
                await self._fail_all(error)
                continue
            metrics.TOKENS.labels(self.name).inc(tokens)
            metrics.BATCH_REQUESTS.labels(self.name).observe(len(self.rows))
            await self._deliver()

    async def _admit(self) -> None:
        """Pull while the KV budget and the sequence cap have room; prepare what fits."""
        reserved = sum(s.reserved for s in self.active)
        room = self.limits.kv_tokens - reserved - sum(j.est_tokens for j in self.pulled)
        count = len(self.active) + len(self.pulled)
        if room > 0 and count < self.limits.max_sequences:
            timeout = BUSY_POLL_S if self.active or self.pulled else IDLE_POLL_S
            self.pulled += await pull_or_pause(self.queue, [self.name], room, timeout)
        while self.pulled and len(self.active) < self.limits.max_sequences:
            job = self.pulled[0]
            if self.active and reserved + job.est_tokens > self.limits.kv_tokens:
                break  # waits for room; a job over the whole budget runs alone
            self.pulled.pop(0)
            if job.id in self.queue.cancelled([job.id]):
                continue
            try:
                outcome = await self._device.call(self._prepare, job)
            except Exception as exc:  # _prepare classifies bad input: this is a bug
                log.exception("preparing a job on %s crashed", self.name)
                outcome = InferenceFailed(f"the worker failed on this request: {exc!r}")
            if isinstance(outcome, FlotillaError):
                metrics.JOBS.labels(self.name, type(outcome).__name__).inc()
                await self.queue.complete(job.id, outcome)
                continue
            self.prefilling.append(outcome)
            reserved += outcome.reserved

    async def _drop_departed(self) -> None:
        """Sequences nobody waits for (the client left) or past their deadline stop now."""
        live = self.active
        now = self.clock()
        jobs = (s.job for s in live)
        still = await settle_departed(self.queue, self.name, jobs, now, while_="generating")
        kept = {job.id for job in still}
        for s in live:
            if s.job.id not in kept:
                s.finish = "expired" if s.job.deadline <= now else "cancelled"
        self._leave()

    def _leave(self) -> None:
        keep = [i for i, s in enumerate(self.rows) if s.finish is None]
        if len(keep) != len(self.rows):
            self.batch.keep(keep)
            self.rows = [self.rows[i] for i in keep]
        self.prefilling = [s for s in self.prefilling if s.finish is None]

    async def _fail_all(self, error: FlotillaError) -> None:
        await fail_all(self.queue, (s.job for s in self.active), error)
        self.rows, self.prefilling, self.batch = [], [], KVBatch()

    # -- device thread ----------------------------------------------------------

    def _prepare(self, job: Job) -> Sequence | FlotillaError:
        """Decode and tokenize a job; its own bad input fails it alone."""
        try:
            request = requests.decode(ApiShape(job.shape), job.body)
            runtime = self.runtime
            if request.kind == "chat":
                if runtime.chat_template is None:
                    raise TaskNotSupported(
                        f"model {self.name!r} has no chat template: use /v1/completions, or "
                        "give it a chat_template in the fleet file"
                    )
                prompt = runtime.render_chat(request.messages)
            elif isinstance(request.prompt, str):
                prompt = runtime.encode(request.prompt)
            else:
                prompt = list(request.prompt)
            window = self.limits.window
            max_new = request.max_new_tokens or min(
                self.limits.default_new_tokens, max(1, window - len(prompt))
            )
            if len(prompt) + max_new > window:
                raise ContextWindowExceeded(
                    f"the prompt has {len(prompt)} tokens and asks for up to {max_new} more: "
                    f"{len(prompt) + max_new} is over model {self.name!r}'s context window "
                    f"of {window} tokens; shorten the prompt or lower max_tokens"
                )
        except FlotillaError as exc:
            return exc
        return Sequence(
            job=job,
            reply=Reply.of(job.id, self.name, request),
            prompt=prompt,
            max_new=max_new,
            sampler=Sampler(request.temperature, request.top_p, request.seed),
            text=TextSoFar(runtime.decode, request.stop),
            started=self.clock(),
        )

    def _decode(self) -> int:
        """One decode step for the running batch; returns the tokens made."""
        if not self.rows:
            return 0
        logits = self.batch.step(self.runtime.model, [s.generated[-1] for s in self.rows])
        for i, s in enumerate(self.rows):
            self._took(s, s.sampler.pick(logits[i]))
        return len(self.rows)

    def _prefill(self) -> int:
        """Prefill within the chunk budget; returns the first tokens made."""
        model = self.runtime.model
        made = 0
        fresh, chunked = self._prefill_plan()
        if fresh:
            cache, last = prefill_many(model, [s.prompt for s in fresh])
            joining = []
            for i, s in enumerate(fresh):
                s.prefilled = len(s.prompt)
                made += 1
                if self._first(s, last[i]):
                    joining.append(i)
            if joining:
                lengths = [len(fresh[i].prompt) for i in joining]
                if len(joining) < len(fresh):
                    cache = rows_of(cache, joining, max(lengths))
                self.batch.join(cache, lengths)
                self.rows += [fresh[i] for i in joining]
        for s, take in chunked:
            chunk = s.prompt[s.prefilled : s.prefilled + take]
            s.cache, last_one = prefill(model, s.cache, chunk, s.prefilled)
            s.prefilled += len(chunk)
            if s.prefilled == len(s.prompt):
                made += 1
                if self._first(s, last_one):
                    self.batch.join(s.cache, [len(s.prompt)])
                    self.rows.append(s)
                s.cache = None
        self.prefilling = [s for s in self.prefilling if s.prefilled < len(s.prompt)]
        return made

    def _prefill_plan(self) -> tuple[list[Sequence], list[tuple[Sequence, int]]]:
        """What this iteration prefills, in arrival order within the chunk budget: short
        prompts whole, together in one padded forward (their padding counts against the
        budget), and the next chunk of each long prompt, alone."""
        budget = chunk = self.limits.prefill_chunk_tokens
        fresh: list[Sequence] = []
        chunked: list[tuple[Sequence, int]] = []
        width = 0
        for s in self.prefilling:
            if budget <= 0:
                break
            if s.cache is None and len(s.prompt) <= chunk:
                wider = max(width, len(s.prompt))
                cost = (len(fresh) + 1) * wider - len(fresh) * width
                if cost > budget:
                    break  # no later prompt overtakes this one
                fresh.append(s)
                budget -= cost
                width = wider
            else:
                take = min(budget, len(s.prompt) - s.prefilled)
                chunked.append((s, take))
                budget -= take
        return fresh, chunked

    def _first(self, s: Sequence, logits: torch.Tensor) -> bool:
        """A sequence's first token, after its prompt; whether it goes on to the batch."""
        s.out += s.reply.opening() if s.streams else b""
        self._took(s, s.sampler.pick(logits))
        if s.finish is None:
            return True
        self.done_first.append(s)
        return False

    def _took(self, s: Sequence, token: int) -> None:
        s.generated.append(token)
        if token in self.runtime.eos_token_ids:
            s.finish = "stop"
        else:
            s.text.add(token)
            if s.text.stopped:
                s.finish = "stop"
            elif len(s.generated) >= s.max_new or len(s.prompt) + len(s.generated) >= (
                self.limits.window
            ):
                s.finish = "length"
        if s.streams and s.finish is None:
            s.out += s.reply.delta(s.text.delta())

    # -- delivering ---------------------------------------------------------------

    async def _deliver(self) -> None:
        # Sequences that finished with their first token never joined the batch.
        done_first, self.done_first = self.done_first, []
        for s in [*self.rows, *done_first]:
            if s.finish is not None:
                await self._complete(s)
            elif s.out and self.streams is not None:  # else all of it goes with the outcome
                await self._send(s)
        self._leave()

    async def _send(self, s: Sequence) -> None:
        body, s.out = s.out, b""
        assert self.streams is not None
        if not await self.streams.partial(s.job.id, Partial(s.sent, body)):
            s.finish = "cancelled"  # the client left: the sequence stops here
            metrics.JOBS.labels(self.name, "cancelled").inc()
        s.sent += 1

    async def _complete(self, s: Sequence) -> None:
        finish = s.finish or "stop"
        prompt_n, made = len(s.prompt), len(s.generated)
        if s.streams:
            body = s.out + s.reply.closing(s.text.delta(final=True), finish, prompt_n, made)
            media = "text/event-stream"
        else:
            body = s.reply.whole(s.text.text, finish, prompt_n, made, s.generated)
            media = "application/json"
        s.out = b""
        now = self.clock()
        timings = Timings(
            queue_s=max(0.0, s.started - s.job.enqueued_at), inference_s=now - s.started
        )
        metrics.JOBS.labels(self.name, "ok").inc()
        result = JobResult(
            body=body,
            prompt_tokens=prompt_n,
            timings=timings,
            media_type=media,
            extra_headers={"x-completion-tokens": str(made)},
        )
        await self.queue.complete(s.job.id, result)
