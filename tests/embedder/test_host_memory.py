"""Eviction hands the memory back, measured on the real thing: all-minilm-l6-v2's packaged
weights under two on-demand entries, a budget that holds one, the process's resident set
as the meter. Loading the second evicts the first, and the resident set falls by most of
what the first's load added; every answer matches the model loaded alone."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest

from embedder.core.jobs import ApiShape, JobResult
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.residency.memory import limit_arenas
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.fleet import DEFAULT_FLEET, load_fleet, parse_fleet
from tests.embedder.tasks.embed.test_worker import Client, vectors_of

pytestmark = pytest.mark.slow
TEXTS = ["a short query", "Der Vertrag ist nichtig, wenn er gegen ein Gesetz verstößt."]


def minilm_twice() -> object:
    bundled = load_fleet(DEFAULT_FLEET).get("all-minilm-l6-v2")
    entry = bundled.model_dump(mode="json", exclude={"name", "aliases", "profiles"})
    entry.update(load="on_demand", profiles={"cpu": {"dtype": "float32", "threads": 1}})
    return parse_fleet({"models": {"first": entry, "second": dict(entry)}})


async def embed(host: ModelHost, client: Client, model: str) -> np.ndarray:
    host.demand(model, time.time() + 120)
    future = await client.embed(model, TEXTS, shape=ApiShape.TEI_EMBED)
    result = await asyncio.wait_for(future, 120)  # a load on a busy machine: seconds
    assert isinstance(result, JobResult), result
    return vectors_of(result)


@dataclass(frozen=True)
class Evicted:
    first: np.ndarray
    second: np.ndarray
    states: tuple[str, str]
    size: int  # what the first's load measured
    freed: int | None  # what its eviction handed back


async def evict_for_the_second() -> Evicted:
    fleet = minilm_twice()
    queue = InProcessQueue()
    host = ModelHost(
        fleet, queue, options=[RequestLimits()], device="cpu", untuned="defaults",  # type: ignore[arg-type]
        backlog=queue.depth, memory_budget_mb=100_000,
    )  # fmt: skip
    client = Client(queue)
    async with host:
        await host.wait_ready()
        first = await embed(host, client, "first")
        size = host.residents.records["first"].memory_bytes
        assert size is not None
        # Room for one of the two (the second counts by its weights until it has loaded),
        # beside what the process holds beyond the models (the budget counts that too).
        host.residents.budget = int(
            max(size, host.residents.records["second"].loading_bytes) * 1.5
            + host.residents.unaccounted()
        )
        second = await embed(host, client, "second")
        states = (host.state("first"), host.state("second"))
        return Evicted(first, second, states, size, host.residents.records["first"].freed_bytes)


def in_a_server_process() -> Evicted:
    return asyncio.run(evict_for_the_second())


def test_evicting_a_real_model_returns_its_memory() -> None:
    """In a process of its own, as a server's host is: this one's heap has served hosts of
    earlier tests, whose threads' heaps blur what one eviction hands back."""
    from sentence_transformers import SentenceTransformer

    spawn = multiprocessing.get_context("spawn")
    # limit_arenas first, as `flotilla` does: before any import starts a thread
    with ProcessPoolExecutor(1, mp_context=spawn, initializer=limit_arenas) as pool:
        got = pool.submit(in_a_server_process).result(timeout=600)
    assert got.size > 20 << 20  # 22.7M parameters in fp32 at the least
    assert got.states == ("evicted", "ready")
    assert got.freed is not None and got.freed >= 0.5 * got.size, (got.freed, got.size)
    folder = minilm_twice().get("first").source.resolve()  # type: ignore[attr-defined]
    alone = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, normalize_embeddings=True)
    for vectors in (got.first, got.second):
        assert np.abs(vectors - alone).max() < 1e-4
