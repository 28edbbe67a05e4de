"""One `flotilla gateway` and two `flotilla worker` processes on a three-node NATS
cluster, the work queue replicated on every node (``--nats-replicas 3``, file storage),
under a steady closed load while the cluster loses a node:

- the node every process is connected to, made the work stream's leader first, is
  SIGKILLed and restarted 3 s later on its port and store;
- every node is restarted in turn (a rolling upgrade).

Every answer is checked: the model's own vectors, or a 503 whose body says what
happened and when to retry. Under 1% of the requests may get one; none may get a 504
or no answer (nothing lost), and correct answers must arrive at 90% of the steady
rate again within 10 s of the cluster being whole."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from bench.chaos.accounting import OK, Answer, Phase, messages_text, phase_table, summarize
from bench.chaos.faults import Faults, run_phases
from bench.chaos.load import Check, Load, Request
from bench.services.nats import NatsCluster
from tests.distributed.cluster import (
    MIN_COSINE,
    Cluster,
    expected_vectors,
    free_port,
    mixed_requests,
    processes,
    start_cluster,
    vectors_of,
    wait_until_serving,
)
from tests.gateway.conftest import hub_offline
from tests.kafka.fixtures import unique_name
from tests.tiny_models import build_tiny_embedder, tiny_fleet_file

pytestmark = pytest.mark.slow

CLIENTS = 16
WARMUP_S = 2.0
STEADY_S = 8.0
OUTAGE_S = 3.0
RECOVERED_WITHIN_S = 10.0
WINDOW_S = 2.0  # recovered: a window this long at 90% of the steady rate
MAX_ERROR_SHARE = 0.01


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-cluster")
    with hub_offline():
        return tiny_fleet_file(folder, build_tiny_embedder(folder))


def requests_and_check(fleet_file: Path) -> tuple[list[Request], Check]:
    mixed = mixed_requests()
    want = expected_vectors(fleet_file, [t for _, _, texts in mixed for t in texts])

    def check(i: int, payload: bytes) -> bool:
        route, _, texts = mixed[i]
        got = vectors_of(route, json.loads(payload))
        if got.shape[0] != len(texts):
            return False
        return bool((got * np.stack([want[t] for t in texts])).sum(axis=1).min() >= MIN_COSINE)

    return [Request(route, json.dumps(body).encode()) for route, body, _ in mixed], check


async def under_fault(
    broker: NatsCluster, fleet_file: Path, tmp_path: Path, fault: str
) -> tuple[list[Answer], list[Phase], Cluster]:
    """Start the processes on a fresh stream, warm up, then run the steady phase and
    ``fault`` under load; the cluster is whole again when this returns, even on failure."""
    port = free_port()
    stream = unique_name("JOBS").replace("-", "_")
    shared = [
        "--nats", broker.urls, "--fleet", str(fleet_file), "--nats-stream", stream,
        "--nats-subject-prefix", f"jobs.{stream}", "--nats-storage", "file",
        "--nats-replicas", "3", "--nats-ack-wait-s", "2", "--log-level", "warning",
    ]  # fmt: skip
    with processes() as procs:
        cluster = start_cluster(procs, shared, port, 2, tmp_path)
        requests, check = await asyncio.to_thread(requests_and_check, fleet_file)
        url = f"http://127.0.0.1:{port}"
        await wait_until_serving(url, 2, procs)
        timeout = aiohttp.ClientTimeout(total=60)
        connector = aiohttp.TCPConnector(limit=CLIENTS + 2)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await Faults(broker, stream, lambda: None, time.monotonic, OUTAGE_S).aim()
            warmup = Load(session, url, requests, check)
            asyncio.get_running_loop().call_later(WARMUP_S, warmup.stop)
            await warmup.run(CLIENTS)
            load = Load(session, url, requests, check)
            faults = Faults(broker, stream, lambda: None, load.now, OUTAGE_S)
            running = asyncio.create_task(load.run(CLIENTS))
            try:
                phases = await run_phases(faults, [fault], STEADY_S, RECOVERED_WITHIN_S + WINDOW_S)
            finally:
                load.stop()
                answers = await running
                if broker.down:
                    await asyncio.to_thread(broker.restart, *broker.down)
        cluster.gateway.stop()
        for worker in cluster.workers:
            worker.stop()
    return answers, phases, cluster


def verdict(answers: list[Answer], phases: list[Phase], cluster: Cluster) -> None:
    rows = summarize(answers, phases, WINDOW_S)
    print(f"\n{phase_table(rows)}\n{messages_text(rows)}")
    logs = "\n".join(p.tail() for p in [cluster.gateway, *cluster.workers])
    wrong = [a for a in answers if a.outcome not in (OK, "503")]
    assert not wrong, f"{len(wrong)} answers neither right nor 503: {wrong[:5]}\n{logs}"
    unexplained = [a for a in answers if a.outcome == "503" and "Retry-After" not in a.detail]
    assert not unexplained, unexplained[:5]
    errors = sum(1 for a in answers if not a.ok)
    assert errors <= MAX_ERROR_SHARE * len(answers), (errors, len(answers), rows, logs)
    recovered = rows[-1]["recovery_s"]
    assert recovered is not None and recovered <= RECOVERED_WITHIN_S, (rows[-1], logs)


async def test_a_node_killed_and_restarted_under_load_loses_nothing(
    nats_cluster: NatsCluster, fleet_file: Path, tmp_path: Path
) -> None:
    verdict(*await under_fault(nats_cluster, fleet_file, tmp_path, "broker-kill"))


async def test_a_rolling_restart_under_load_loses_nothing(
    nats_cluster: NatsCluster, fleet_file: Path, tmp_path: Path
) -> None:
    verdict(*await under_fault(nats_cluster, fleet_file, tmp_path, "rolling-restart"))
