"""``NatsCluster``: three real nats-servers with routes between them, whose nodes can be
killed and restarted on the same ports and stores, and whose streams keep what they
hold through it; ``python -m bench.services.nats --cluster 3`` prints their URLs."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig

from bench.services.nats import NatsCluster
from tests.kafka.fixtures import unique_name

pytestmark = pytest.mark.slow


async def publish(js: JetStreamContext, subject: str, count: int) -> None:
    """``count`` acknowledged messages, each retried through a leader election (under
    one message id, so that a retry of a message stored unacknowledged is dropped)."""
    for i in range(count):
        msg_id = {"Nats-Msg-Id": uuid.uuid4().hex}
        for _ in range(100):
            try:
                await js.publish(subject, str(i).encode(), timeout=1, headers=msg_id)
                break
            except (nats.errors.Error, TimeoutError):
                await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"message {i} was never stored")


def stored(cluster: NatsCluster, index: int, stream: str) -> int:
    """Messages of ``stream`` in node ``index``'s own replica."""
    _, jsz = cluster.nodes[index].monitor("/jsz?streams=true")
    return sum(
        detail["state"]["messages"]
        for account in jsz.get("account_details", [])
        for detail in account.get("stream_detail", [])
        if detail["name"] == stream
    )


async def test_a_killed_leader_restarts_on_its_port_and_store_and_catches_up(
    nats_cluster: NatsCluster,
) -> None:
    assert nats_cluster.urls.split(",") == nats_cluster.url_list
    assert len(set(nats_cluster.url_list)) == 3
    stream = unique_name("CLUSTER").replace("-", "_")
    nc = await nats.connect(nats_cluster.url_list)
    try:
        js = nc.jetstream()
        config = StreamConfig(name=stream, subjects=[f"{stream}.>"], num_replicas=3,
                              storage=StorageType.FILE)  # fmt: skip
        await js.add_stream(config)
        await publish(js, f"{stream}.a", 10)
        await nats_cluster.move_leader(stream, 1)
        url, pid = nats_cluster.url_list[1], nats_cluster.pids[1]
        await asyncio.to_thread(nats_cluster.kill, 1)
        assert nats_cluster.down == [1]
        await publish(js, f"{stream}.a", 10)  # the two left elect a leader and go on
        assert nats_cluster.leader(stream) in (0, 2)
        await asyncio.to_thread(nats_cluster.restart, 1)
        assert nats_cluster.down == [] and nats_cluster.url_list[1] == url
        assert nats_cluster.pids[1] != pid
        assert [stored(nats_cluster, i, stream) for i in range(3)] == [20, 20, 20]
        await js.delete_stream(stream)
    finally:
        await nc.close()


async def test_a_rolling_restart_keeps_every_stream(nats_cluster: NatsCluster) -> None:
    stream = unique_name("ROLLING").replace("-", "_")
    nc = await nats.connect(nats_cluster.url_list)
    try:
        js = nc.jetstream()
        config = StreamConfig(name=stream, subjects=[f"{stream}.>"], num_replicas=3,
                              storage=StorageType.FILE)  # fmt: skip
        await js.add_stream(config)
        await publish(js, f"{stream}.a", 5)
        took = await asyncio.to_thread(nats_cluster.rolling_restart)
        assert len(took) == 3
        assert nats_cluster.leader(stream) is not None
        assert [stored(nats_cluster, i, stream) for i in range(3)] == [5, 5, 5]
        await js.delete_stream(stream)
    finally:
        await nc.close()


async def test_one_node_is_a_plain_server_that_keeps_its_store() -> None:
    with NatsCluster(1) as server:
        nc = await nats.connect(server.url_list)
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="ONE", subjects=["one.>"]))
            await publish(js, "one.a", 3)
            await asyncio.to_thread(server.kill, 0)
            await asyncio.to_thread(server.restart, 0)
            await publish(js, "one.a", 1)  # the client reconnected to the same port
            assert (await js.stream_info("ONE")).state.messages == 4
        finally:
            await nc.close()


def test_the_module_prints_the_cluster_urls() -> None:
    command = [sys.executable, "-m", "bench.services.nats", "--cluster", "3"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            urls = process.stdout.readline().strip().split(",")
            assert len(urls) == 3, urls
            assert all(url.startswith("nats://127.0.0.1:") for url in urls), urls
        finally:
            process.send_signal(signal.SIGINT)
            try:
                code = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                raise AssertionError("it did not stop within 60 s of Ctrl-C") from None
            assert code == 0
