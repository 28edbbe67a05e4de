"""An engine of one loop per model, for kinds whose loop serves a single model
(continuous batching over one model's KV cache; one OCR model's rounds)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

from embedder.core.fleet import ModelSpec


class _Info(Protocol):
    @property
    def info(self) -> Any: ...


class ModelLoop(Protocol):
    @property
    def runtime(self) -> _Info: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def running(self) -> bool: ...

    def in_hand(self) -> int: ...


class OneLoopPerModel:
    def __init__(self, make_loop: Callable[[ModelSpec, Any], ModelLoop]) -> None:
        self.make_loop = make_loop
        self.loops: dict[str, ModelLoop] = {}

    async def serve(self, spec: ModelSpec, runtime: Any) -> None:
        loop = self.make_loop(spec, runtime)
        await loop.start()
        self.loops[spec.name] = loop

    def describe(self, model: str) -> dict[str, object] | None:
        loop = self.loops.get(model)
        return None if loop is None else asdict(loop.runtime.info)

    def healthy(self, model: str) -> bool:
        loop = self.loops.get(model)
        return loop is not None and loop.running()

    def in_hand(self, model: str) -> int:
        loop = self.loops.get(model)
        return 0 if loop is None else loop.in_hand()

    async def unserve(self, model: str) -> None:
        """Stop the model's loop; the host unloads a model only with nothing in hand, so
        nothing is failed by it."""
        await self.loops.pop(model).stop()

    async def stop(self) -> None:
        loops, self.loops = list(self.loops.values()), {}
        for loop in loops:
            await loop.stop()
