"""Moving a served model to another runtime between batches (``EncoderEngine.switch``):
a closed loop of requests runs through the switch and every one is answered right, none
failed or late; a batch prepared with the old runtime runs on it to the end; the new
runtime holds the old one's resident adapters before it serves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from embedder.core.adapters import AdapterCatalog
from embedder.core.errors import FlotillaError
from embedder.core.jobs import TruncationSide
from embedder.queue.inprocess import InProcessQueue
from embedder.serving.turns import DeviceTurns
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.engine import EncoderEngine
from embedder.tasks.embed.runtimes import Encoded
from embedder.tasks.kind import EngineContext
from tests.embedder.tasks.embed.test_worker import WAIT_S, Client, until, vectors_of
from tests.fakes import FakeRuntime, fake_fleet

SHIFT = 7  # the new runtime's token ids are the old one's plus this


class ShiftedRuntime(FakeRuntime):
    """The same model behind another tokenizer: ids shifted, undone in the forward pass.
    Its answers equal the old runtime's, but a batch tokenized by one and run by the other
    comes out wrong, so a mix-up cannot pass unseen."""

    def tokenize(self, texts: Sequence[str], side: TruncationSide, prefix: str = "") -> Encoded:
        encoded = super().tokenize(texts, side, prefix)
        return Encoded(
            [[i + SHIFT for i in ids] for ids in encoded.ids], None, encoded.full_lengths
        )

    def vector_of_ids(self, ids: Sequence[int]) -> NDArray[np.float32]:
        return super().vector_of_ids([i - SHIFT for i in ids])


def engine_for(fleet: Any) -> EncoderEngine:
    context = EngineContext(
        InProcessQueue(),
        DeviceTurns(),
        "cpu",
        AdapterCatalog(fleet),
        {RequestLimits: RequestLimits()},
    )
    return EncoderEngine(context)


async def test_a_closed_loop_of_requests_runs_through_a_switch_unharmed() -> None:
    fleet = fake_fleet("m")
    spec = fleet.get("m")
    old = FakeRuntime(spec, seconds_per_token=2e-4)
    new = ShiftedRuntime(spec, seconds_per_token=1e-4)
    engine = engine_for(fleet)
    client = Client(engine.context.queue)  # type: ignore[arg-type]
    answered: list[tuple[str, float, object]] = []
    switched = asyncio.Event()

    async def user(n: int) -> None:
        for k in range(400):
            text = f"user {n} request {k} " + "word " * (k % 9)
            sent = time.monotonic()
            future = await client.embed("m", [text])
            try:
                result: object = await asyncio.wait_for(future, WAIT_S)
            except FlotillaError as exc:
                result = exc
            answered.append((text, time.monotonic() - sent, result))
            if switched.is_set() and k > 40:
                return

    await engine.serve(spec, old)
    try:
        users = [asyncio.create_task(user(n)) for n in range(6)]
        await until(lambda: len(old.forward_calls) > 5)  # the loop is in full flow
        forwards_before = len(old.forward_calls)
        await engine.switch(spec, new)
        switched.set()
        old_after_switch = len(old.forward_calls)
        await asyncio.gather(*users)
    finally:
        await engine.stop()

    assert forwards_before > 5 and new.forward_calls  # both runtimes served batches
    assert len(old.forward_calls) == old_after_switch  # the old one is out once switch returns
    assert engine.loaded["m"].runtime is new
    failed = [(text, result) for text, _, result in answered if not hasattr(result, "body")]
    assert failed == []
    for text, _, result in answered:
        np.testing.assert_allclose(vectors_of(result), [old.expected_vector(text)], atol=1e-6)  # type: ignore[arg-type]
    # Nobody waited for the switch: the slowest answer is a few batches, not a load.
    assert max(latency for _, latency, _ in answered) < 2.0


async def test_the_new_runtime_takes_the_resident_adapters_before_it_serves(
    tmp_path: Path,
) -> None:
    fleet = fake_fleet("m")
    spec = fleet.get("m")
    old, new = FakeRuntime(spec), FakeRuntime(spec)
    engine = engine_for(fleet)
    await engine.serve(spec, old)
    try:
        resident = engine.loaded["m"].resident
        assert resident is not None
        assert resident.ensure({"a": tmp_path / "a", "b": tmp_path / "b"}) == {}
        await engine.switch(spec, new)
    finally:
        await engine.stop()
    assert new.adapter_loads == ["a", "b"]  # in the old one's order: least recent first
    switched = engine.loaded["m"].resident
    assert switched is not None and switched.names == ["a", "b"]
