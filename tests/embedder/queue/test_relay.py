"""Relay: the shared queue's jobs in the in-process queue beside local ingest jobs, the
in-process queue's one rule ordering both; outcomes back to the shared queue; a bounded
hold; withdrawal of what the shared queue gave up on."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace

from embedder.core.errors import DeadlineExceeded, FlotillaError
from embedder.core.jobs import Job, JobResult
from embedder.queue.inprocess import InProcessQueue
from embedder.queue.protocol import Outcome
from embedder.queue.relay import Relay
from embedder.tasks.embed.batching import take_within, urgency
from tests.distributed.helpers import eventually
from tests.embedder.queue.test_inprocess import WAIT_S, ids, job, result


class SharedQueue:
    """A shared queue's worker half, in memory: jobs wait until pulled, are held until
    completed or handed back, and every outcome is recorded."""

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        self.waiting = sorted(jobs, key=urgency)
        self.held: dict[str, Job] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.asked: list[int] = []  # the token budget of each pull that found jobs
        self.fail_next = 0
        self.pull_delay_s = 0.0
        self.pulling = asyncio.Event()  # set when a pull begins

    def add(self, *jobs: Job) -> None:
        self.waiting = sorted([*self.waiting, *jobs], key=urgency)

    async def pull(self, models: Collection[str], max_tokens: int, timeout_s: float) -> list[Job]:
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("the shared queue's connection broke")
        self.pulling.set()
        await asyncio.sleep(self.pull_delay_s or 0.005)
        taken = take_within((j for j in self.waiting if j.model in models), max_tokens)
        if taken:
            self.asked.append(max_tokens)
        for j in taken:
            self.waiting.remove(j)
            self.held[j.id] = j
        return taken

    async def complete(self, job_id: str, outcome: Outcome) -> None:
        if self.held.pop(job_id, None) is not None:
            self.outcomes[job_id] = outcome

    def cancelled(self, job_ids: Iterable[str]) -> set[str]:
        return {job_id for job_id in job_ids if job_id not in self.held}

    async def hand_back(self, jobs: Sequence[Job]) -> None:
        """The worker's hand-back: waiting again, one delivery more, unless answered."""
        back = [replace(j, deliveries=j.deliveries + 1) for j in jobs if j.id in self.held]
        for j in back:
            del self.held[j.id]
        self.add(*back)

    def give_to_another(self, job_id: str) -> None:
        """Another worker takes it (as after a drain past its timeout)."""
        del self.held[job_id]


def relay(shared: SharedQueue, local: InProcessQueue, budget: int = 1000) -> Relay:
    return Relay(shared, local, models=lambda: ["alpha"], budget=lambda: budget)


async def test_online_jobs_come_out_ahead_of_an_ingest_backlog() -> None:
    local = InProcessQueue()
    backlog = [await local.put(job(f"doc-{i}", deadline_in_s=600)) for i in range(50)]
    shared = SharedQueue(job(f"online-{i}", deadline_in_s=30) for i in range(3))
    async with relay(shared, local):
        await eventually(lambda: not shared.waiting, "the online jobs relayed", WAIT_S)
        first = await local.pull(["alpha"], 50, WAIT_S)
    assert ids(first[:3]) == ["online-0", "online-1", "online-2"]
    assert ids(first[3:]) == [f"doc-{i}" for i in range(2)]  # ingest fills the rest
    assert not any(f.done() for f in backlog)


async def test_an_old_ingest_job_goes_before_a_newer_online_one() -> None:
    """The deadline rule, not a source rule: ingest is never starved by steady online
    load, its turn comes once its deadline is the nearest."""
    local = InProcessQueue()
    await local.put(job("doc-old", deadline_in_s=5))
    shared = SharedQueue([job("online-new", deadline_in_s=30)])
    async with relay(shared, local):
        await eventually(lambda: not shared.waiting, "the online job relayed", WAIT_S)
        assert ids(await local.pull(["alpha"], 100, WAIT_S)) == ["doc-old", "online-new"]


async def test_outcomes_go_back_to_the_shared_queue() -> None:
    local = InProcessQueue()
    shared = SharedQueue([job("a"), job("b")])
    async with relay(shared, local) as r:
        await eventually(lambda: not shared.waiting, "both relayed", WAIT_S)
        a, b = await local.pull(["alpha"], 100, WAIT_S)
        await local.complete(a.id, result("vectors"))
        await local.complete(b.id, DeadlineExceeded("too late"))
        await eventually(lambda: len(shared.outcomes) == 2, "both outcomes back", WAIT_S)
        assert r.held_tokens() == 0
    got = shared.outcomes
    assert isinstance(got["a"], JobResult) and got["a"].body == b"vectors"
    assert isinstance(got["b"], FlotillaError) and "too late" in got["b"].message


async def test_holds_about_its_budget_and_takes_more_as_jobs_are_answered() -> None:
    local = InProcessQueue()
    shared = SharedQueue(job(f"j{i}", tokens=100, deadline_in_s=30 + i) for i in range(10))
    async with relay(shared, local, budget=300) as r:
        await eventually(lambda: len(shared.held) == 3, "three jobs relayed", WAIT_S)
        await asyncio.sleep(0.05)
        assert len(shared.held) == 3 and r.held_tokens() == 300  # the rest stays shared
        taken = await local.pull(["alpha"], 100, WAIT_S)
        await local.complete(taken[0].id, result())
        more = lambda: len(shared.held) == 3 and len(shared.waiting) == 6  # noqa: E731
        await eventually(more, "one more relayed", WAIT_S)
    assert all(asked <= 300 for asked in shared.asked)


async def test_a_job_handed_back_is_withdrawn_and_never_runs() -> None:
    local = InProcessQueue()
    shared = SharedQueue([job("kept"), job("gone")])
    async with relay(shared, local):
        await eventually(lambda: not shared.waiting, "both relayed", WAIT_S)
        shared.give_to_another("gone")
        await eventually(lambda: "gone" in local.cancelled(["gone"]), "withdrawn", WAIT_S)
        assert ids(await local.pull(["alpha"], 100, WAIT_S)) == ["kept"]


async def test_the_fake_shared_queue_takes_back_what_a_worker_hands_back() -> None:
    shared = SharedQueue([job("a"), job("b")])
    taken = await shared.pull(["alpha"], 100, 0)
    await shared.complete("b", result())
    await shared.hand_back(taken)
    assert [(j.id, j.deliveries) for j in shared.waiting] == [("a", 2)]


async def test_a_failing_pull_is_retried_and_stop_keeps_a_pull_in_flight() -> None:
    local = InProcessQueue()
    shared = SharedQueue()
    shared.fail_next = 2
    r = relay(shared, local)
    await r.start()
    await eventually(lambda: shared.fail_next == 0, "the failures met", WAIT_S)
    shared.pull_delay_s = 0.2
    shared.add(job("late"))
    shared.pulling.clear()
    await asyncio.wait_for(shared.pulling.wait(), WAIT_S)  # a pull is under way
    await r.stop()
    # The job that pull took is in the in-process queue, to be run and answered.
    assert ids(await local.pull(["alpha"], 100, WAIT_S)) == ["late"]
    await local.complete("late", result())
    await r.close()
    assert "late" in shared.outcomes
