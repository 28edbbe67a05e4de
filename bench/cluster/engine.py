"""Push versus pull: a discrete-event simulation of a cluster of embedding workers.

Each worker runs one batch at a time; a batch costs what the real runtime
measured (``bench.cluster.cost_model``: fixed cost + per padded token) and is
formed by the worker's own rule (``embedder.tasks.embed.batching``): a model's group is
flushed when it holds the worker's token budget (``max_batch_tokens``) or
``max_batch_requests``, or when its oldest request has waited ``max_wait_ms``; the
batch is the most urgent group (earliest deadline, here earliest arrival) filled in
arrival order up to the budget, skipping requests that do not fit
(``workloads.fill``). A worker runs one model's requests per batch.

Under ``pull`` the requests wait in one shared queue and a free worker forms its
batch from it; under a push policy (``bench.cluster.policies``) a router places
each request on a worker on arrival, where it waits in that worker's own queue,
batched with whatever that worker received.

The fleet may be uneven. ``slowdowns``: worker w's batch costs ``slowdowns[w]`` times
the cost model's (older devices). ``hosting``: the models each worker hosts; a pull
worker forms its batch from its own models only (the most urgent of them), and a push
router places a request among its model's hosts by the same policy (``SimRouter``).
The offered load is then a fraction of the fleet's capacity, which counts a worker
``s`` times slower as ``1/s`` of a worker. ``pace`` (``fleet.PACES``): a worker takes by
its own pace, a token budget it can finish within ``pace_share`` of the latency target
at its own speed (``fleet.paced_budget``), so that a slow device takes less and leaves
the rest in the shared queue for the faster ones; by default on for pull when the
slowdowns differ and a target is known, off otherwise. Optional per-request
``deadlines`` let a slow pull worker leave to a faster host what it would finish late
(``bench.cluster.deadlines``).

Simplifications: forming a batch and routing cost nothing; deadlines never
expire (a late request is still served; they only steer which worker takes it);
pull's free workers take in turn, longest idle first, whatever their speed; a
worker scans at most ``workloads.SCAN`` requests past one that does
not fit. Pull here is the ideal shared queue: a batch forms from it when a
worker is free. The real worker pulls eagerly (an idle worker takes the first
arrival and waits ``max_wait`` for company, later arrivals going to other idle
workers) and prefetches (while a batch runs it forms the next and holds up to
twice its budget pending). The first makes low-load batches smaller than here,
where one free worker gathers a whole ``max_wait`` window of the cluster's
arrivals (pull's p99 at low load is a little higher for it); the second lets a
busy worker hold work that a free one could run, which is not modelled.
"""

from __future__ import annotations

import heapq
import math
import random
import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.cluster.cost_model import CostModel, padded_tokens
from bench.cluster.deadlines import fill_in_time
from bench.cluster.fleet import PACE_SHARE, Fleet, Hosting, make_fleet
from bench.cluster.policies import POLICIES, VIEW_POLICIES, SimRouter
from bench.cluster.workloads import SEED, Capacity, Workload, capacity, fill

WARMUP = 0.1  # share of the requests, the first to arrive, left out of the statistics
DONE, TIMER, REFRESH, WAKE = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class BatchLog:
    worker: int
    start: float
    end: float
    model: int
    requests: tuple[int, ...]


@dataclass
class SimResult:
    policy: str
    workers: int
    staleness_ms: float
    load: float  # offered, fraction of capacity
    requests: int  # measured (after warm-up)
    p50_s: float
    p99_s: float
    mean_s: float
    utilization: float  # busy share of the workers' time over the measured span
    batch_requests: float  # mean over batches started in the measured span
    batch_tokens: float
    tokens_per_s: float  # offered tokens/s over the measured span
    aborted: bool = False  # stopped early: more than 1% of requests already over the target
    pace: str = "off"  # which workers sized their batches by their own pace (fleet.PACES)


def simulate(
    workload: Workload,
    cost: CostModel,
    *,
    workers: int,
    policy: str,
    load: float,
    staleness_s: float = 0.0,
    seed: int = SEED,
    p99_target_s: float | None = None,
    load_metric: str = "tokens",
    cap: Capacity | None = None,
    log: list[BatchLog] | None = None,
    routers: int = 1,
    slowdowns: Sequence[float] | None = None,
    hosting: Hosting | None = None,
    pace: str | None = None,
    pace_share: float = PACE_SHARE,
    latency_target_s: float | None = None,
    deadlines: Sequence[float] | None = None,
) -> SimResult:
    """Run every request of ``workload`` at ``load`` through ``workers`` workers.

    With ``p99_target_s``, stops as soon as more than 1% of the measured requests
    are known to miss it (the p99 can only be over the target then): ``aborted``.
    ``log`` receives every batch (tests check conservation and the batching rule).
    ``routers``: independent push routers (gateway replicas), each request reaching
    one at random; each keeps its own round-robin turn and its own sends (least+own),
    all share the snapshot.
    ``slowdowns``, ``hosting``, ``pace``, ``pace_share``: the fleet (``fleet.make_fleet``),
    ``latency_target_s`` the target a paced budget is a share of (default the p99 target).
    ``deadlines``: per request, the seconds it may take from arrival; a slow pull worker
    leaves a request it would finish late to a faster host (``deadlines.fill_in_time``).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    target = latency_target_s if latency_target_s is not None else p99_target_s
    fleet = make_fleet(
        workers,
        workload.n_models,
        cost,
        policy,
        slowdowns=slowdowns,
        hosting=hosting,
        pace=pace,
        pace_share=pace_share,
        target_s=target,
    )
    cap = cap or capacity(workload, cost)
    times = workload.arrivals(load * fleet.speed * cap.requests_per_s)
    key = f"{seed}/{policy}/{workers}/{staleness_s}/{routers}"
    run = _Run(
        workload,
        cost,
        times,
        fleet=fleet,
        policy=policy,
        staleness_s=staleness_s,
        routers=routers,
        rng=random.Random(zlib.crc32(key.encode())),
        target_s=p99_target_s if p99_target_s is not None else math.inf,
        by_tokens=load_metric == "tokens",
        log=log,
    )
    if deadlines is not None and policy == "pull":
        run.keep_deadlines(deadlines)
    run.play()
    return run.result(load)


class _Run:
    """One simulation's state: the queue sets, the workers, the event heap and the
    statistics of the measured span. ``play`` takes the events and the arrivals in time
    order, the earlier first and an event before an arrival at the same time."""

    def __init__(
        self,
        workload: Workload,
        cost: CostModel,
        times: list[float],
        *,
        fleet: Fleet,
        policy: str,
        staleness_s: float,
        routers: int,
        rng: random.Random,
        target_s: float,
        by_tokens: bool,
        log: list[BatchLog] | None,
    ) -> None:
        self.times, self.tokens, self.lengths = times, workload.tokens, workload.lengths
        self.models, self.n_models = workload.models, workload.n_models
        self.cost, self.log = cost, log
        # The batching rule's numbers, read on every event.
        self.max_requests = cost.max_batch_requests
        self.max_wait = cost.max_wait_s
        workers = fleet.workers
        self.workers, self.policy, self.staleness_s = workers, policy, staleness_s
        self.fleet, self.slowdowns, self.budgets = fleet, fleet.slowdowns, fleet.budgets
        self.hosted, self.hosts = fleet.hosted, fleet.hosts(self.n_models)
        # Every worker alike (hosts every model, the same budget): the first free one
        # is as good as any, which keeps the shared queue's service to a cheap loop.
        self.alike = fleet.hosts_all(self.n_models) and len(set(fleet.budgets)) == 1
        self.subsets = not fleet.hosts_all(self.n_models)
        self.pull, self.by_tokens, self.target_s = policy == "pull", by_tokens, target_s
        n = len(times)
        # Queue sets: the shared one (pull) or one per worker (push); per model a FIFO.
        n_sets = 1 if self.pull else workers
        self.queues = [[deque[int]() for _ in range(self.n_models)] for _ in range(n_sets)]
        self.queued_tokens = [[0] * self.n_models for _ in range(n_sets)]
        self.pending = [0] * n_sets
        self.timer_at = [math.inf] * n_sets
        self.busy = [False] * workers
        self.idle = deque(range(workers))  # pull: free workers, longest idle first
        self.live = [0] * workers  # push: outstanding load (queued + running) per worker
        self.running = [0] * workers
        # Push places each arrival by it; pull never asks (arrivals join the shared queue).
        self.router = SimRouter(policy, workers, routers, staleness_s > 0, self.live, rng.random)
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.done = [0.0] * n
        # The statistics leave out the first WARMUP of the arrivals.
        self.warm = int(n * WARMUP)
        self.t0, self.t1 = times[self.warm], times[-1]
        self.allowed_over = (n - self.warm) - math.ceil(0.99 * (n - self.warm))
        self.over = 0
        self.busy_s = 0.0
        self.batches = self.batch_requests = self.batch_tokens = 0
        self.aborted = False
        self.deadline_at: list[float] = []  # keep_deadlines: each request's, absolute
        self.wakes: set[float] = set()  # instants a WAKE event is pending for

    def keep_deadlines(self, allowance_s: Sequence[float]) -> None:
        """Pull: a slow worker leaves what it would finish late to a faster host."""
        if len(allowance_s) != len(self.times):
            raise ValueError(f"need a deadline per request ({len(self.times)})")
        self.deadline_at = [t + a for t, a in zip(self.times, allowance_s, strict=True)]
        self.free_at = [0.0] * self.workers  # when each worker's running batch ends
        self.alike = False  # workers of different speeds take differently

    def batch_run_s(self, tokens: int) -> float:
        """A batch of ``tokens`` at speed 1, padding left out (the deadlines' estimate)."""
        return self.cost.fixed_s + self.cost.per_token_s * tokens

    def flushable(self, s: int, w: int, t: float) -> bool:
        """Whether worker ``w`` has a batch due in set ``s``: a group of its models is full
        to its budget or the request cap, or its oldest request has waited max_wait."""
        qs, qt, times = self.queues[s], self.queued_tokens[s], self.times
        max_requests, max_tokens, max_wait = self.max_requests, self.budgets[w], self.max_wait
        for m in self.hosted[w]:
            q = qs[m]
            if q and (len(q) >= max_requests or qt[m] >= max_tokens or times[q[0]] + max_wait <= t):
                return True
        return False

    def arm(self, s: int, t: float, models: Iterable[int] | None = None) -> None:
        """A timer for when set ``s``'s oldest request (of ``models``, default all) will
        have waited max_wait."""
        qs, times, max_wait = self.queues[s], self.times, self.max_wait
        # Only what is still to come: a group due now that a worker left (deadlines) waits
        # for a wake-up, a finished batch or an arrival instead.
        dues = [
            times[qs[m][0]] + max_wait
            for m in (range(self.n_models) if models is None else models)
            if qs[m] and times[qs[m][0]] + max_wait > t
        ]
        if not dues:
            return
        due = min(dues)
        if due < self.timer_at[s] or self.timer_at[s] <= t:
            self.timer_at[s] = due
            self.push_event(due, TIMER, s)

    def push_event(self, t: float, kind: int, x: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, x))

    def start(self, w: int, s: int, t: float) -> bool:
        """Worker ``w`` starts a batch from set ``s``: its most urgent model's group, to
        its budget, at its speed; False when it takes nothing (deadlines left it all)."""
        qs, times, cost = self.queues[s], self.times, self.cost
        if self.deadline_at:
            group, chosen, total = self.pick_in_time(w, t)
            if not chosen:
                return False
        else:
            group = -1
            for m in self.hosted[w]:
                if qs[m] and (group < 0 or times[qs[m][0]] < times[qs[group][0]]):
                    group = m
            chosen, total = fill(qs[group], self.tokens, self.budgets[w], self.max_requests)
        self.queued_tokens[s][group] -= total
        self.pending[s] -= len(chosen)
        flat = [k for i in chosen for k in self.lengths[i]]
        padded = padded_tokens(flat, cost.forward_tokens, cost.forward_max_sequences)
        slow = self.slowdowns[w]
        if slow == 1.0:  # summed in this order, so that a plain fleet's runs stay as they were
            end = t + cost.fixed_s + cost.per_token_s * padded
        else:
            end = t + slow * (cost.fixed_s + cost.per_token_s * padded)
        for i in chosen:
            self.done[i] = end
            if i >= self.warm and end - times[i] > self.target_s:
                self.over += 1
        if self.over > self.allowed_over:
            self.aborted = True
        self.busy[w] = True
        if self.deadline_at:
            self.free_at[w] = end
        self.running[w] = total if self.by_tokens else len(chosen)
        self.push_event(end, DONE, w)
        self.count(BatchLog(w, t, end, group, tuple(chosen)), total)
        return True

    def pick_in_time(self, w: int, t: float) -> tuple[int, list[int], int]:
        """The shared queue's batch for ``w`` under deadlines: its groups most urgent first,
        the first of which it may take something from; a wake-up for what it left."""
        qs, times, free_at, slowdowns = self.queues[0], self.times, self.free_at, self.slowdowns
        slow = slowdowns[w]
        groups = sorted((times[qs[m][0]], m) for m in self.hosted[w] if qs[m])
        for _, m in groups:
            chosen, total, wake = fill_in_time(
                qs[m],
                self.tokens,
                self.budgets[w],
                self.max_requests,
                t=t,
                deadline_at=self.deadline_at,
                run_s=self.batch_run_s,
                slow=self.slowdowns[w],
                faster=[(free_at[h], slowdowns[h]) for h in self.hosts[m] if slowdowns[h] < slow],
            )
            if wake < math.inf and wake not in self.wakes:
                self.wakes.add(wake)
                self.push_event(wake, WAKE, 0)
            if chosen:
                return m, chosen, total
        return -1, [], 0

    def count(self, batch: BatchLog, tokens: int) -> None:
        """The batch's share of the measured span's busy time and batch sizes."""
        overlap = min(batch.end, self.t1) - max(batch.start, self.t0)
        if overlap > 0:
            self.busy_s += overlap
        if self.log is not None:
            self.log.append(batch)
        if self.t0 <= batch.start <= self.t1:
            self.batches += 1
            self.batch_requests += len(batch.requests)
            self.batch_tokens += tokens

    def serve_pull(self, t: float) -> None:
        """Free workers, longest idle first, each take a batch if one of theirs is due."""
        idle, pending = self.idle, self.pending
        if self.alike:
            while idle and pending[0] and self.flushable(0, idle[0], t):
                self.start(idle.popleft(), 0, t)
            if idle and pending[0]:
                self.arm(0, t)
            return
        # Taking a batch only shortens the queues, so one that was not due for a worker
        # stays not due: one pass over the free workers serves all that can be.
        for w in list(idle):
            if not pending[0]:
                return
            if self.flushable(0, w, t) and self.start(w, 0, t):
                idle.remove(w)
        if idle and pending[0]:  # the next due of a model some free worker hosts
            self.arm(0, t, {m for w in idle for m in self.hosted[w]})

    def serve_push(self, w: int, t: float) -> None:
        """Free worker ``w`` starts a batch from its own queue if one is due, else waits."""
        if self.flushable(w, w, t):
            self.start(w, w, t)
        else:
            self.arm(w, t)

    def on_done(self, w: int, t: float) -> None:
        self.busy[w] = False
        if self.pull:
            self.idle.append(w)
            if self.pending[0]:
                self.serve_pull(t)
        else:
            self.live[w] -= self.running[w]
            if self.pending[w]:
                self.serve_push(w, t)

    def on_timer(self, s: int, t: float) -> None:
        if self.timer_at[s] != t:
            return  # superseded
        self.timer_at[s] = math.inf
        if self.pull:
            if self.pending[0]:
                self.serve_pull(t)
        elif self.pending[s] and not self.busy[s]:
            self.serve_push(s, t)

    def on_refresh(self, t: float, more_arrivals: bool) -> None:
        """A new snapshot of every worker's load, and the next one while requests come."""
        self.router.refresh()
        if more_arrivals:
            self.push_event(t + self.staleness_s, REFRESH, 0)

    def arrive(self, i: int) -> None:
        t, m = self.times[i], self.models[i]
        if self.pull:
            self.enqueue(0, m, i)
            if self.idle:
                self.serve_pull(t)
            return
        added = self.tokens[i] if self.by_tokens else 1
        if self.subsets:
            w = self.router.route_within(added, self.hosts[m], m)
        else:
            w = self.router.route(added)
        self.enqueue(w, m, i)
        self.live[w] += added
        if not self.busy[w]:
            self.serve_push(w, t)

    def enqueue(self, s: int, m: int, i: int) -> None:
        self.queues[s][m].append(i)
        self.queued_tokens[s][m] += self.tokens[i]
        self.pending[s] += 1

    def play(self) -> None:
        times, heap, n = self.times, self.heap, len(self.times)
        if self.staleness_s > 0 and not self.pull and self.policy in VIEW_POLICIES:
            heapq.heappush(heap, (0.0, 0, REFRESH, 0))
        next_arrival = 0
        while (next_arrival < n or heap) and not self.aborted:
            if heap and (next_arrival >= n or heap[0][0] <= times[next_arrival]):
                t, _, kind, x = heapq.heappop(heap)
                if kind == DONE:
                    self.on_done(x, t)
                elif kind == TIMER:
                    self.on_timer(x, t)
                elif kind == WAKE:
                    self.wakes.discard(t)
                    if self.idle and self.pending[0]:
                        self.serve_pull(t)
                else:
                    self.on_refresh(t, next_arrival < n)
                continue
            self.arrive(next_arrival)
            next_arrival += 1

    def result(self, load: float) -> SimResult:
        warm, n, times = self.warm, len(self.times), self.times
        measured = np.asarray(self.done[warm:]) - np.asarray(times[warm:])
        span = max(self.t1 - self.t0, 1e-12)
        if self.aborted:
            p50 = p99 = mean = math.inf
        else:
            ordered = np.sort(measured)
            p50 = float(ordered[max(0, math.ceil(0.50 * len(ordered)) - 1)])
            p99 = float(ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)])
            mean = float(ordered.mean())
        return SimResult(
            policy=self.policy,
            workers=self.workers,
            staleness_ms=self.staleness_s * 1e3,
            load=load,
            requests=n - warm,
            p50_s=p50,
            p99_s=p99,
            mean_s=mean,
            utilization=self.busy_s / (self.workers * span),
            batch_requests=self.batch_requests / max(1, self.batches),
            batch_tokens=self.batch_tokens / max(1, self.batches),
            tokens_per_s=sum(self.tokens[warm:]) / span,
            aborted=self.aborted,
            pace=self.fleet.pace,
        )
