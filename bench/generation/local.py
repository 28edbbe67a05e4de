"""The baselines as an OpenAI-compatible streaming server: transformers'
``model.generate`` one request at a time, or on static batches.

Run as its own process (``python -m bench.generation.local``) so that the
benchmark's client measures it exactly as it measures llama.cpp and flotilla:
the same SSE parsing, the same clocks, a separate process. The model is the
GGUF dequantized by transformers (fp32), loaded once; the request's ``model``
field picks the baseline:

- ``one-at-a-time``: each request alone, in arrival order, ``model.generate``
  on it (what a naive server does);
- ``static-N``: the worker waits for up to N requests (at most
  ``--batch-wait-ms`` after the first), pads them left and runs one
  ``model.generate`` over the batch until every row is done; nothing joins a
  running batch. Each row's stream ends at its own EOS or ``max_tokens``, so
  its client is free early, but the next batch starts only when the longest
  row ends. TTFT is the batch's first step.

Greedy only: ``do_sample=False`` whatever the request says.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

ONE_AT_A_TIME = "one-at-a-time"


def batch_size_of(model: str) -> int:
    """``one-at-a-time`` -> 1, ``static-N`` -> N; ValueError for anything else."""
    if model == ONE_AT_A_TIME:
        return 1
    prefix, _, size = model.partition("-")
    if prefix == "static" and size.isdigit() and int(size) > 0:
        return int(size)
    raise ValueError(f"model must be {ONE_AT_A_TIME!r} or 'static-N', got {model!r}")


@dataclass
class Pending:
    """One request waiting for, or in, a batch; events go back to its handler."""

    input_ids: list[int]
    max_tokens: int
    batch_size: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)

    def send(self, *event: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class Generator:
    """The worker thread: takes pending requests, runs ``model.generate``."""

    def __init__(self, gguf: Path, threads: int, batch_wait_ms: float) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # Any: generate's stubs want a BaseStreamer; Rows is one by shape (put, end)
        # without importing transformers where this module is only read for its names.
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        self.model.eval()  # type: ignore[no-untyped-call]
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.pad_id = int(self.tokenizer.pad_token_id or self.eos_id)
        self.batch_wait_s = batch_wait_ms / 1e3
        self.inbox: queue.Queue[Pending | None] = queue.Queue()
        self._deferred: list[Pending] = []
        self._thread = threading.Thread(target=self._run, name="generate", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.inbox.put(None)
        self._thread.join(timeout=30)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def _next_batch(self) -> list[Pending] | None:
        first = self._deferred.pop(0) if self._deferred else self.inbox.get()
        if first is None:
            return None
        batch = [first]
        deadline = time.monotonic() + self.batch_wait_s
        while len(batch) < first.batch_size:
            remaining = deadline - time.monotonic()
            try:
                item = self.inbox.get(timeout=max(remaining, 0)) if remaining > 0 else None
            except queue.Empty:
                item = None
            if item is None:
                break
            (batch if item.batch_size == first.batch_size else self._deferred).append(item)
        return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                self._generate(batch)
            except Exception as exc:  # every waiter gets the error; the worker goes on
                for pending in batch:
                    pending.send("error", f"{type(exc).__name__}: {exc}")

    def _generate(self, batch: Sequence[Pending]) -> None:
        torch = self.torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        width = max(len(p.input_ids) for p in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, pending in enumerate(batch):
            ids[row, width - len(pending.input_ids) :] = torch.tensor(pending.input_ids)
            mask[row, width - len(pending.input_ids) :] = 1
        rows = Rows(batch, self.tokenizer, self.eos_id)

        limits = torch.tensor([p.max_tokens for p in batch])

        class RowsDone(StoppingCriteria):
            # From the ids, not from the streamer: generate hands the streamer a
            # step's tokens after it asks this, and one step late is a wasted step.
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                return input_ids.shape[1] - width >= limits

        with torch.inference_mode():
            self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max(p.max_tokens for p in batch),
                do_sample=False,
                pad_token_id=self.pad_id,
                eos_token_id=self.eos_id,
                streamer=rows,
                stopping_criteria=StoppingCriteriaList([RowsDone()]),
            )
        rows.finish_all("length")


class Rows:
    """The streamer ``generate`` calls once with the prompts and then once per
    step with each row's new token: it sends each row's text as it grows and
    ends the row at EOS or its ``max_tokens``."""

    def __init__(self, batch: Sequence[Pending], tokenizer: Any, eos_id: int) -> None:
        self.batch = batch
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.tokens: list[list[int]] = [[] for _ in batch]
        self.sent_text = [""] * len(batch)
        self.done = [False] * len(batch)
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # the first call carries the prompts
            self._prompt_seen = True
            return
        for row, token in enumerate(value.reshape(-1).tolist()):
            if self.done[row]:
                continue
            pending = self.batch[row]
            if token == self.eos_id:
                self._finish(row, "stop")
                continue
            self.tokens[row].append(token)
            text = self.tokenizer.decode(self.tokens[row], skip_special_tokens=True)
            if not text.endswith("\ufffd"):  # hold back half a UTF-8 character
                delta = text[len(self.sent_text[row]) :]
                if delta:
                    self.sent_text[row] = text
                    pending.send("text", delta)
            if len(self.tokens[row]) >= pending.max_tokens:
                self._finish(row, "length")

    def end(self) -> None:
        pass

    def finish_all(self, reason: str) -> None:
        for row in range(len(self.batch)):
            if not self.done[row]:
                self._finish(row, reason)

    def _finish(self, row: int, reason: str) -> None:
        self.done[row] = True
        pending = self.batch[row]
        text = self.tokenizer.decode(self.tokens[row], skip_special_tokens=True)
        if text[len(self.sent_text[row]) :]:
            pending.send("text", text[len(self.sent_text[row]) :])
        pending.send("end", reason, len(pending.input_ids), len(self.tokens[row]))


def _chunk(rid: str, model: str, delta: dict[str, Any], finish: str | None) -> bytes:
    event = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def make_app(generator: Generator) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            size = batch_size_of(str(body.get("model")))
            if body.get("stream") is not True:
                raise ValueError("this baseline server answers only stream: true")
            max_tokens = int(body.get("max_tokens") or 16)
            ids = generator.prompt_ids(body["messages"])
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        pending = Pending(ids, max_tokens, size, asyncio.get_running_loop())
        generator.inbox.put(pending)
        model = body["model"]
        rid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_chunk(rid, model, {"role": "assistant", "content": ""}, None))
        while True:
            kind, *rest = await pending.events.get()
            if kind == "text":
                await response.write(_chunk(rid, model, {"content": rest[0]}, None))
            elif kind == "error":
                error = {"error": {"message": rest[0]}}
                await response.write(b"data: " + json.dumps(error).encode() + b"\n\n")
                break
            else:
                reason, prompt_tokens, completion_tokens = rest
                await response.write(_chunk(rid, model, {}, reason))
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    }
                    event = {"id": rid, "model": model, "choices": [], "usage": usage}
                    await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                break
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.generation.local")
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-wait-ms", type=float, default=50.0)
    args = parser.parse_args(argv)
    generator = Generator(args.gguf, args.threads, args.batch_wait_ms)
    generator.start()
    try:
        web.run_app(make_app(generator), host=args.host, port=args.port, print=None)
    finally:
        generator.stop()


if __name__ == "__main__":
    main()
