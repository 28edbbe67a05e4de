"""The faults a chaos run injects into a broker under load, and the run's phases.

Every process is given node 0's URL (flotilla's ``--nats`` takes one URL; the client
learns the other nodes from the server), so a fault on node 0 cuts every connection.
Each fault returns when it began and when the broker was whole again (``back_s``,
from which recovery is measured); the phase then runs on for the recovery period.

- ``broker-kill``: SIGKILL the broker (on a cluster node 0, made the work stream's leader
  before the load began, by ``aim``: the worst node to lose), keep it down ``outage_s``,
  restart it on its port and store;
- ``rolling-restart``: restart every node in turn, each once the cluster is healthy
  again, as an upgrade does (a cluster only);
- ``worker-kill-in-outage``: SIGKILL every broker node, SIGKILL a worker while they are
  down (its held requests unacked) and start its replacement at once, as a supervisor
  would, then restart the broker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bench.chaos.accounting import Phase
from bench.services.nats import NatsCluster

WORKER_KILL_AFTER_S = 1.0  # into the outage: the workers have seen the broker go


@dataclass
class Faults:
    broker: NatsCluster
    stream: str  # the work-queue stream, whose leader the node kill aims at
    replace_worker: Callable[[], None]  # SIGKILL a worker and start another in its place
    clock: Callable[[], float]  # seconds since the run began
    outage_s: float

    async def aim(self) -> None:
        """Make node 0 the work stream's leader. Before the load starts: a leader that
        steps down loses the publishes in flight, a fault of its own."""
        if self.broker.size > 1:
            await self.broker.move_leader(self.stream, 0)

    async def broker_kill(self) -> tuple[float, float]:
        await self.aim()  # a no-op when aimed before, as the runs do
        fault = self.clock()
        await asyncio.to_thread(self.broker.kill, 0)
        await asyncio.sleep(self.outage_s)
        await asyncio.to_thread(self.broker.restart, 0)
        return fault, self.clock()

    async def rolling_restart(self) -> tuple[float, float]:
        fault = self.clock()
        await asyncio.to_thread(self.broker.rolling_restart)
        return fault, self.clock()

    async def worker_kill_in_outage(self) -> tuple[float, float]:
        every = range(self.broker.size)
        fault = self.clock()
        await asyncio.to_thread(self.broker.kill, *every)
        await asyncio.sleep(WORKER_KILL_AFTER_S)
        await asyncio.to_thread(self.replace_worker)
        await asyncio.sleep(max(0.0, self.outage_s - WORKER_KILL_AFTER_S))
        await asyncio.to_thread(self.broker.restart, *every)
        return fault, self.clock()


FAULTS: dict[str, Callable[[Faults], Awaitable[tuple[float, float]]]] = {
    "broker-kill": Faults.broker_kill,
    "rolling-restart": Faults.rolling_restart,
    "worker-kill-in-outage": Faults.worker_kill_in_outage,
}


def faults_for(cluster: bool) -> list[str]:
    """The faults in the order a run injects them, after the steady phase."""
    if cluster:
        return ["broker-kill", "rolling-restart", "worker-kill-in-outage"]
    return ["broker-kill", "worker-kill-in-outage"]


async def run_phases(
    faults: Faults, names: list[str], steady_s: float, recover_s: float
) -> list[Phase]:
    """The steady phase, then each fault followed by ``recover_s`` of load."""
    await asyncio.sleep(steady_s)
    phases = [Phase("steady", 0.0, faults.clock())]
    for name in names:
        start = faults.clock()
        fault_s, back_s = await FAULTS[name](faults)
        await asyncio.sleep(recover_s)
        phases.append(Phase(name, start, faults.clock(), round(fault_s, 3), round(back_s, 3)))
    return phases
