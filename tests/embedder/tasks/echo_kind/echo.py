"""A task kind written for the test of the kind seam: ``/v1/echo`` answers each body
with itself (upper-cased unless its fleet entry says ``shout: false``), from a loop that
pulls its jobs like every other kind's. It is the whole of what a new kind needs: this
module (its folder) and one registry line."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Literal

from embedder.core.fleet import DeviceKind, ModelSpec, entry_as
from embedder.core.jobs import JobResult, Timings
from embedder.core.lifecycle import cancel_and_wait, running, watch
from embedder.queue import JobPuller
from embedder.serving.per_model import ModelLoop, OneLoopPerModel
from embedder.serving.pulling import IDLE_POLL_S, pull_or_pause
from embedder.tasks.kind import Engine, EngineContext, TaskKind

SHAPE = "echo"


class EchoSpec(ModelSpec):
    task: Literal["echo"] = "echo"
    shout: bool = True


@dataclass(frozen=True)
class EchoInfo:
    runtime: str = "echo"


class EchoRuntime:
    info = EchoInfo()


class EchoLoop:
    def __init__(self, queue: JobPuller, spec: EchoSpec) -> None:
        self.queue, self.spec, self.runtime = queue, spec, EchoRuntime()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = watch(asyncio.create_task(self._loop()))

    def running(self) -> bool:
        return running(self._task)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _loop(self) -> None:
        while True:
            for job in await pull_or_pause(self.queue, [self.spec.name], 4096, IDLE_POLL_S):
                text = json.loads(job.body)["text"]
                echoed = text.upper() if self.spec.shout else text
                body = json.dumps({"echo": echoed, "model": job.model}).encode()
                timings = Timings(queue_s=time.time() - job.enqueued_at, inference_s=0.0)
                await self.queue.complete(job.id, JobResult(body, len(text), timings))


def load(spec: ModelSpec, device: DeviceKind, threads: int) -> Any:
    return EchoRuntime()


def make_engine(context: EngineContext) -> Engine:
    def loop(spec: ModelSpec, runtime: Any) -> ModelLoop:
        return EchoLoop(context.queue, entry_as(spec, EchoSpec))

    return OneLoopPerModel(loop)


KIND = TaskKind(
    name="echo",
    spec=EchoSpec,
    routes={"/v1/echo": SHAPE},
    bodies={},
    load=load,
    engine="echo",
    make_engine=make_engine,
)
