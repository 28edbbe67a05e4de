"""Eviction hands the memory back, measured on the real thing: all-minilm-l6-v2's packaged
weights under two on-demand entries, a budget that holds one, the process's resident set
as the meter. Loading the second evicts the first, and the resident set falls by most of
what the first's load added; every answer matches the model loaded alone."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from embedder.core.jobs import ApiShape, JobResult
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
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


async def test_evicting_a_real_model_returns_its_memory() -> None:
    from sentence_transformers import SentenceTransformer

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
        assert size is not None and size > 20 << 20  # 22.7M parameters in fp32 at the least
        # Room for one of the two (the second counts by its weights until it has loaded).
        host.residents.budget = int(
            max(size, host.residents.records["second"].expected_bytes) * 1.5
        )
        second = await embed(host, client, "second")
        assert host.state("first") == "evicted" and host.state("second") == "ready"
        freed = host.residents.records["first"].freed_bytes
        assert freed is not None and freed >= 0.5 * size, (freed, size)
    folder = fleet.get("first").source.resolve()  # type: ignore[attr-defined]
    alone = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, normalize_embeddings=True)
    for got in (first, second):
        assert np.abs(got - alone).max() < 1e-4
