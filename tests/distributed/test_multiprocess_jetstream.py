"""One `flotilla gateway` and three `flotilla worker` processes over the real nats-server:
1,000 mixed requests while one worker is killed with SIGKILL and another is frozen with
SIGSTOP for 3 s. Every request gets one answer, the right vectors or a clear 504; the
frozen worker's share is taken by the others meanwhile (their job counts grow while its
own cannot), and nothing hangs."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.services.nats import NatsServer
from tests.distributed.cluster import (
    CONCURRENCY,
    MIN_COSINE,
    REQUEST_TIMEOUT_S,
    REQUESTS,
    expected_vectors,
    free_port,
    jobs_done,
    mixed_requests,
    processes,
    start_cluster,
    vectors_of,
    wait_until_serving,
)
from tests.kafka.fixtures import unique_name

pytestmark = pytest.mark.slow

KILL_AFTER = 200  # answers before worker 0 is killed
FREEZE_AFTER = 450  # answers before worker 1 is frozen
FREEZE_S = 3.0


async def test_kill_one_worker_and_freeze_another_every_request_answered_once(
    nats_server: NatsServer, fleet_file: Path, tmp_path: Path
) -> None:
    requests = mixed_requests()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stream = unique_name("JOBS").replace("-", "_")
    shared = [
        "--nats", nats_server.url, "--fleet", str(fleet_file), "--nats-stream", stream,
        "--nats-subject-prefix", f"jobs.{stream}", "--nats-storage", "memory",
        # A dead or frozen worker's requests go to the others after 2 s, within deadline.
        "--nats-ack-wait-s", "2", "--log-level", "warning",
    ]  # fmt: skip
    with processes() as procs:
        cluster = start_cluster(procs, shared, port, 3, tmp_path)
        gateway, workers, worker_ports = cluster.gateway, cluster.workers, cluster.worker_ports
        want = await asyncio.to_thread(
            expected_vectors, fleet_file, [t for _, _, texts in requests for t in texts]
        )
        await wait_until_serving(url, 3, procs)

        statuses: Counter[int] = Counter()
        wrong: list[str] = []
        answered = 0
        events: dict[str, float] = {}
        during_freeze: dict[str, float] = {}
        gate = asyncio.Semaphore(CONCURRENCY)
        probe = httpx.AsyncClient(timeout=5)

        async def freeze() -> None:
            before = await jobs_done(probe, worker_ports[2])
            frozen_before = await jobs_done(probe, worker_ports[1])
            answered_before = answered
            workers[1].proc.send_signal(signal.SIGSTOP)
            await asyncio.sleep(FREEZE_S)
            during_freeze["survivor"] = await jobs_done(probe, worker_ports[2]) - before
            during_freeze["answered"] = answered - answered_before
            workers[1].proc.send_signal(signal.SIGCONT)
            during_freeze["frozen"] = await jobs_done(probe, worker_ports[1]) - frozen_before

        freezing: list[asyncio.Task[None]] = []

        async def one(client: httpx.AsyncClient, route: str, body: dict[str, object],
                      texts: list[str]) -> None:  # fmt: skip
            nonlocal answered
            async with gate:
                response = await client.post(route, json=body)
            statuses[response.status_code] += 1
            if response.status_code == 200:
                got = vectors_of(route, response.json())
                cosine = (got * np.stack([want[t] for t in texts])).sum(axis=1)
                if got.shape[0] != len(texts) or cosine.min() < MIN_COSINE:
                    wrong.append(f"{route} {texts[0][:20]!r}: {cosine}")
            elif response.status_code != 504:
                wrong.append(f"{route}: {response.status_code} {response.text[:200]}")
            answered += 1
            if answered == KILL_AFTER:
                workers[0].kill()  # SIGKILL: no drain, no goodbye, its held jobs unacked
                events["killed"] = time.monotonic()
            if answered == FREEZE_AFTER:
                freezing.append(asyncio.create_task(freeze()))

        started = time.monotonic()
        limits = httpx.Limits(max_connections=CONCURRENCY)
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S + 15)
        try:
            async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
                async with asyncio.timeout(90):
                    await asyncio.gather(*(one(client, *r) for r in requests))
                    await asyncio.gather(*freezing)
                took = time.monotonic() - started
                metrics = (await client.get("/metrics")).text
        finally:
            workers[1].proc.send_signal(signal.SIGCONT)
            await probe.aclose()
        dropped = sum(
            sample.value
            for family in text_string_to_metric_families(metrics)
            if family.name == "flotilla_jetstream_replies"
            for sample in family.samples
            if sample.labels.get("outcome") == "dropped"
        )
        print(
            f"\n{REQUESTS} requests in {took:.1f} s: {statuses[200]} answered, "
            f"{statuses[504]} 504; {dropped:.0f} duplicate or late replies dropped; "
            f"during the {FREEZE_S:.0f} s freeze: {during_freeze}"
        )
        assert "killed" in events and freezing
        assert not wrong, wrong[:10]
        assert sum(statuses.values()) == REQUESTS
        assert statuses[200] >= REQUESTS * 0.9, statuses
        # While worker 1 was frozen, the survivor kept taking the queue: requests kept
        # being answered, by it, far beyond what the frozen one finished meanwhile.
        assert during_freeze["answered"] >= 20, during_freeze
        assert during_freeze["survivor"] >= 20, during_freeze
        assert during_freeze["survivor"] > 5 * during_freeze["frozen"], during_freeze
        # The survivors' own ports still say ready after the kill and the freeze.
        async with httpx.AsyncClient(timeout=5) as check:
            for port in worker_ports[1:]:
                assert (await check.get(f"http://127.0.0.1:{port}/ready")).status_code == 200
        for worker in workers[1:]:
            assert worker.stop() == 0, worker.tail()
        assert gateway.stop() in (0, -signal.SIGTERM), gateway.tail()
        assert "Traceback" not in gateway.log.read_text(), gateway.tail()
