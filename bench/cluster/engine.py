"""Push versus pull: a discrete-event simulation of a cluster of embedding workers.

Each worker runs one batch at a time; a batch costs what the real runtime
measured (``bench.cluster.cost_model``: fixed cost + per padded token) and is
formed by the worker's own rule (``embedder.tasks.embed.batching``): a model's group is
flushed when it holds ``max_batch_tokens`` or ``max_batch_requests``, or when
its oldest request has waited ``max_wait_ms``; the batch is the most urgent
group (earliest deadline, here earliest arrival) filled in arrival order up to
the budget, skipping requests that do not fit (``workloads.fill``). Each worker
hosts every model and runs one model's requests per batch.

Under ``pull`` the requests wait in one shared queue and a free worker forms its
batch from it; under a push policy (``bench.cluster.policies``) a router places
each request on a worker on arrival, where it waits in that worker's own queue,
batched with whatever that worker received.

Simplifications: forming a batch and routing cost nothing; deadlines never
expire; a worker scans at most ``workloads.SCAN`` requests past one that does
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
from dataclasses import dataclass

import numpy as np

from bench.cluster.cost_model import CostModel, padded_tokens
from bench.cluster.policies import POLICIES, VIEW_POLICIES, SimRouter
from bench.cluster.workloads import SEED, Capacity, Workload, capacity, fill

WARMUP = 0.1  # share of the requests, the first to arrive, left out of the statistics
DONE, TIMER, REFRESH = 0, 1, 2


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
) -> SimResult:
    """Run every request of ``workload`` at ``load`` through ``workers`` workers.

    With ``p99_target_s``, stops as soon as more than 1% of the measured requests
    are known to miss it (the p99 can only be over the target then): ``aborted``.
    ``log`` receives every batch (tests check conservation and the batching rule).
    ``routers``: independent push routers (gateway replicas), each request reaching
    one at random; each keeps its own round-robin turn and its own sends (least+own),
    all share the snapshot.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    cap = cap or capacity(workload, cost)
    rate = load * workers * cap.requests_per_s
    times = workload.arrivals(rate)
    tokens, lengths, models = workload.tokens, workload.lengths, workload.models
    n, n_models = len(times), workload.n_models
    max_tokens, max_requests = cost.max_batch_tokens, cost.max_batch_requests
    max_wait, fixed_s, per_token_s = cost.max_wait_s, cost.fixed_s, cost.per_token_s
    fwd_tokens, fwd_seqs = cost.forward_tokens, cost.forward_max_sequences
    pull = policy == "pull"
    key = f"{seed}/{policy}/{workers}/{staleness_s}/{routers}"
    rng = random.Random(zlib.crc32(key.encode()))

    # Queue sets: the shared one (pull) or one per worker (push); per model a FIFO.
    n_sets = 1 if pull else workers
    queues = [[deque[int]() for _ in range(n_models)] for _ in range(n_sets)]
    queued_tokens = [[0] * n_models for _ in range(n_sets)]
    pending = [0] * n_sets
    timer_at = [math.inf] * n_sets
    busy = [False] * workers
    idle = deque(range(workers))  # pull: free workers, longest idle first
    by_tokens = load_metric == "tokens"
    live = [0] * workers  # push: outstanding load (queued + running) per worker
    running = [0] * workers
    # Push places each arrival by it; pull never asks (arrivals join the shared queue).
    router = SimRouter(policy, workers, routers, staleness_s > 0, live, rng.random)
    heap: list[tuple[float, int, int, int]] = []
    seq = 0
    done = [0.0] * n

    warm = int(n * WARMUP)
    t0, t1 = times[warm], times[-1]
    allowed_over = (n - warm) - math.ceil(0.99 * (n - warm))
    target = p99_target_s if p99_target_s is not None else math.inf
    over = 0
    busy_s = 0.0
    batches = batch_requests = batch_tokens = 0
    aborted = False

    def flushable(s: int, t: float) -> bool:
        qs, qt = queues[s], queued_tokens[s]
        for m in range(n_models):
            q = qs[m]
            if q and (len(q) >= max_requests or qt[m] >= max_tokens or times[q[0]] + max_wait <= t):
                return True
        return False

    def arm(s: int, t: float) -> None:
        """A timer for when set ``s``'s oldest request will have waited max_wait."""
        nonlocal seq
        due = min(times[q[0]] for q in queues[s] if q) + max_wait
        if due < timer_at[s] or timer_at[s] <= t:
            timer_at[s] = due
            seq += 1
            heapq.heappush(heap, (due, seq, TIMER, s))

    def start(w: int, s: int, t: float) -> None:
        nonlocal seq, over, busy_s, batches, batch_requests, batch_tokens, aborted
        qs = queues[s]
        group = -1
        for m in range(n_models):
            if qs[m] and (group < 0 or times[qs[m][0]] < times[qs[group][0]]):
                group = m
        chosen, total = fill(qs[group], tokens, max_tokens, max_requests)
        queued_tokens[s][group] -= total
        pending[s] -= len(chosen)
        flat = [k for i in chosen for k in lengths[i]]
        end = t + fixed_s + per_token_s * padded_tokens(flat, fwd_tokens, fwd_seqs)
        for i in chosen:
            done[i] = end
            if i >= warm and end - times[i] > target:
                over += 1
        if over > allowed_over:
            aborted = True
        busy[w] = True
        running[w] = total if by_tokens else len(chosen)
        seq += 1
        heapq.heappush(heap, (end, seq, DONE, w))
        overlap = min(end, t1) - max(t, t0)
        if overlap > 0:
            busy_s += overlap
        if log is not None:
            log.append(BatchLog(w, t, end, group, tuple(chosen)))
        if t0 <= t <= t1:
            batches += 1
            batch_requests += len(chosen)
            batch_tokens += total

    def serve_pull(t: float) -> None:
        while idle and pending[0] and flushable(0, t):
            start(idle.popleft(), 0, t)
        if idle and pending[0]:
            arm(0, t)

    if staleness_s > 0 and not pull and policy in VIEW_POLICIES:
        heapq.heappush(heap, (0.0, 0, REFRESH, 0))
    next_arrival = 0
    while next_arrival < n or heap:
        if aborted:
            break
        if heap and (next_arrival >= n or heap[0][0] <= times[next_arrival]):
            t, _, kind, x = heapq.heappop(heap)
            if kind == DONE:
                busy[x] = False
                if pull:
                    idle.append(x)
                    if pending[0]:
                        serve_pull(t)
                else:
                    live[x] -= running[x]
                    if pending[x]:
                        if flushable(x, t):
                            start(x, x, t)
                        else:
                            arm(x, t)
            elif kind == TIMER:
                if timer_at[x] != t:
                    continue  # superseded
                timer_at[x] = math.inf
                if pull:
                    if pending[0]:
                        serve_pull(t)
                elif pending[x] and not busy[x]:
                    if flushable(x, t):
                        start(x, x, t)
                    else:
                        arm(x, t)
            else:  # REFRESH: a new snapshot of every worker's load
                router.refresh()
                if next_arrival < n:
                    seq += 1
                    heapq.heappush(heap, (t + staleness_s, seq, REFRESH, 0))
            continue
        i = next_arrival
        next_arrival += 1
        t = times[i]
        m = models[i]
        if pull:
            queues[0][m].append(i)
            queued_tokens[0][m] += tokens[i]
            pending[0] += 1
            if idle:
                serve_pull(t)
            continue
        added = tokens[i] if by_tokens else 1
        w = router.route(added)
        queues[w][m].append(i)
        queued_tokens[w][m] += tokens[i]
        pending[w] += 1
        live[w] += added
        if not busy[w]:
            if flushable(w, t):
                start(w, w, t)
            else:
                arm(w, t)

    measured = np.asarray(done[warm:]) - np.asarray(times[warm:])
    span = max(t1 - t0, 1e-12)
    if aborted:
        p50 = p99 = mean = math.inf
    else:
        ordered = np.sort(measured)
        p50 = float(ordered[max(0, math.ceil(0.50 * len(ordered)) - 1)])
        p99 = float(ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)])
        mean = float(ordered.mean())
    return SimResult(
        policy=policy,
        workers=workers,
        staleness_ms=staleness_s * 1e3,
        load=load,
        requests=n - warm,
        p50_s=p50,
        p99_s=p99,
        mean_s=mean,
        utilization=busy_s / (workers * span),
        batch_requests=batch_requests / max(1, batches),
        batch_tokens=batch_tokens / max(1, batches),
        tokens_per_s=sum(tokens[warm:]) / span,
        aborted=aborted,
    )
