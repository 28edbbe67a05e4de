"""Placement across machines: one `flotilla gateway` and two `flotilla worker` processes
over the real nats-server, every model of the fleet loaded on demand. A request for a
model no worker holds is queued, and a worker loads the model and answers it; a model
idle past --idle-evict-s is evicted, and loaded again for the next request; a model no
worker can host (bigger than every budget) is refused at once with the reason."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
import yaml

from bench.services.nats import NatsServer
from tests.distributed.cluster import Process, free_port, processes
from tests.distributed.helpers import eventually
from tests.kafka.fixtures import unique_name

pytestmark = pytest.mark.slow

NAMES = ("m0", "m1", "m2")
IDLE_EVICT_S = 3.0
BUDGET_MB = 4000  # the tiny models, and the runtime's first load, fit; "huge" does not


def placement_fleet(folder: Path, tiny_fleet: Path) -> Path:
    """The tiny model (of ``tiny_fleet``) under three names, and a 'huge' one whose
    weights (a sparse file) outweigh every budget: all loaded on demand."""
    model_dir = yaml.safe_load(tiny_fleet.read_text())["models"]["tiny"]["source"]["path"]
    huge = folder / "huge"
    huge.mkdir()
    with (huge / "model.safetensors").open("wb") as weights:
        weights.truncate(2 * BUDGET_MB << 20)
    profile = {"cpu": {"dtype": "float32", "max_batch_tokens": 4096, "max_wait_ms": 2}}
    spec = {"task": "embed", "max_tokens": 64, "load": "on_demand", "profiles": profile}
    models = {name: {**spec, "source": {"path": str(model_dir)}} for name in NAMES}
    models["huge"] = {**spec, "source": {"path": str(huge)}}
    path = folder / "placement.yaml"
    path.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
    return path


async def models_of(client: httpx.AsyncClient) -> dict[str, dict[str, object]]:
    return {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}


async def embed(client: httpx.AsyncClient, model: str) -> httpx.Response:
    return await client.post("/v1/embeddings", json={"model": model, "input": ["placed"]})


async def test_models_are_placed_on_demand_evicted_when_idle_and_refused_when_too_big(
    nats_server: NatsServer, fleet_file: Path, tmp_path: Path
) -> None:
    fleet = placement_fleet(tmp_path, fleet_file)
    port = free_port()
    stream = unique_name("JOBS").replace("-", "_")
    shared = [
        "--nats", nats_server.url, "--fleet", str(fleet), "--nats-stream", stream,
        "--nats-subject-prefix", f"jobs.{stream}", "--nats-storage", "memory",
        "--nats-max-bytes", str(32 << 20), "--log-level", "info",
    ]  # fmt: skip
    with processes() as procs:
        gateway = [*shared, "--host", "127.0.0.1", "--port", str(port)]
        gateway += ["--request-timeout-s", "90", "--gateway-id", "gw"]
        gateway += ["--reply-topic-prefix", unique_name("replies")]
        procs.append(Process("gateway", gateway, tmp_path / "gateway.log"))
        for i in range(2):
            worker = [*shared, "--device", "cpu", "--threads", "1", "--worker-port", "0"]
            worker += ["--memory-budget-mb", str(BUDGET_MB), "--idle-evict-s", str(IDLE_EVICT_S)]
            procs.append(Process("worker", worker, tmp_path / f"worker-{i}.log"))
        logs = "\n".join
        try:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=120
            ) as client:

                async def hosted_by_both() -> bool:
                    try:
                        seen = await models_of(client)
                    except httpx.HTTPError:
                        return False
                    return all(seen[n]["state"] == "evicted" and seen[n]["hosts"] == 2
                               for n in NAMES)  # fmt: skip

                await eventually(hosted_by_both, "both workers offering the models", 120)
                huge = (await models_of(client))["huge"]
                assert huge["state"] == "failed", huge

                started = time.monotonic()
                refused = await embed(client, "huge")
                assert refused.status_code == 503, refused.text
                assert "no live worker can host it" in refused.text
                assert time.monotonic() - started < 2

                first = await embed(client, "m1")  # no worker holds it: one loads it
                assert first.status_code == 200, first.text
                assert len(first.json()["data"][0]["embedding"]) == 32

                async def m1_is(state: str) -> bool:
                    return (await models_of(client))["m1"]["state"] == state

                await eventually(lambda: m1_is("ready"), "the heartbeats saying m1 is ready", 5)
                await eventually(lambda: m1_is("evicted"), "the idle m1 evicted", 30)
                again = await asyncio.gather(*(embed(client, n) for n in ("m1", "m2", "m0")))
                assert [r.status_code for r in again] == [200, 200, 200], [r.text for r in again]
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{logs(p.tail() for p in procs)}") from exc
