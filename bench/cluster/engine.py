"""Push versus pull: a discrete-event simulation of a cluster of embedding workers.

Each worker runs one batch at a time; a batch costs what the real runtime
measured (``bench.cluster.calibrate``: fixed cost + per padded token) and is
formed by the worker's own rule (``embedder.batching``): a model's group is
flushed when it holds ``max_batch_tokens`` or ``max_batch_requests``, or when
its oldest request has waited ``max_wait_ms``; the batch is the most urgent
group (earliest deadline, here earliest arrival) filled in arrival order up to
the budget, skipping requests that do not fit. Each worker hosts every model
and runs one model's requests per batch.

Policies:

- ``pull``: one shared queue; a free worker forms its batch from it.
- ``rr`` (push): a router sends request k to worker k mod n.
- ``least`` (push): to the worker with the least outstanding load (queued plus
  running tokens) in the router's view, ties broken at random.
- ``p2c`` (push): the lesser-loaded of two random workers in that view.
- ``least+own`` (push): ``least`` on the view plus what this router itself sent
  since the view was taken (a router that counts its own assignments).

The router's view is a snapshot of every worker's load taken every R ms
(stale in between); R = 0 is a perfect, always-current view. A pushed request
waits in its worker's own queue, batched with whatever that worker received.

Workloads: ``small`` (1-3 inputs of 8-32 tokens), ``mixed`` (a heavy tail:
Pareto(1.2) inputs per request, at most 64, lengths drawn from bench.texts'
mix and cut at 256), ``bursty`` (small; on/off Poisson, exponential on and off
periods of one full-batch time on average, twice the mean rate when on) and
``multimodel`` (small, over 4 models of 48/24/16/12% popularity). Arrivals come
at an offered load, a fraction of the cluster's capacity: the request rate at
which every worker, forming full batches, is just busy all the time. The figure
of merit is the highest offered load whose p99 latency stays under a target
(bisection), given in full-batch times of the workload or in ms, and pull's
over each push policy's: the throughput ratio at that p99.

Simplifications: forming a batch and routing cost nothing; deadlines never
expire; a worker scans at most ``SCAN`` requests past one that does not fit.
Pull here is the ideal shared queue: a batch forms from it when a worker is
free. The real worker pulls eagerly (an idle worker takes the first arrival
and waits ``max_wait`` for company, later arrivals going to other idle
workers) and prefetches (while a batch runs it forms the next and holds up to
twice its budget pending). The first makes low-load batches smaller than here,
where one free worker gathers a whole ``max_wait`` window of the cluster's
arrivals (pull's p99 at low load is a little higher for it); the second lets a
busy worker hold work that a free one could run, which is not modelled.

    python -m bench.cluster.engine [--workers 8 16 32 64] [--staleness-ms 0 5 20 50 100 200]
        [--workload small mixed bursty multimodel] [--p99-batches 2 4 | --p99-ms MS ...]
        [--routers 1] [--cost cpu | --cost gpu-like --gpu-speedup 100] [--quick]
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import random
import time
import zlib
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from bench import report
from bench.cluster.calibrate import (
    GPU_FIXED_FACTOR,
    GPU_PER_TOKEN_DIVISOR,
    CostModel,
    gpu_like,
    load_cost,
    padded_tokens,
)

POLICIES = ("pull", "rr", "least", "p2c", "least+own")
PUSH = POLICIES[1:]
VIEW_POLICIES = frozenset({"least", "p2c", "least+own"})  # those that read the load view
WORKLOADS = ("small", "mixed", "bursty", "multimodel")
MODEL_MAX_TOKENS = 256  # all-MiniLM-L6-v2 truncates inputs here
# (share, shortest, longest) tokens per input for ``mixed``: bench.texts.LENGTH_MIX.
LENGTH_MIX: tuple[tuple[float, int, int], ...] = (
    (0.40, 8, 32),
    (0.30, 32, 128),
    (0.20, 128, 256),
    (0.10, 256, 512),
)
PARETO_ALPHA = 1.2  # inputs per ``mixed`` request: floor(Pareto(1.2)), at most 64
MAX_INPUTS = 64
MODEL_SHARES = (0.48, 0.24, 0.16, 0.12)  # ``multimodel``: Zipf popularity of 4 models
BURST_UNITS = 1.0  # ``bursty``: mean on and mean off period, in the workload's full-batch times
SCAN = 256  # requests a batch scans past the first that does not fit
WARMUP = 0.1  # share of the requests, the first to arrive, left out of the statistics
SEED = 20261129
DONE, TIMER, REFRESH = 0, 1, 2


# -- workloads ---------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, and unit-rate arrival instants to scale to a rate:
    every offered load sees the same requests (common random numbers)."""

    name: str
    models: list[int]
    tokens: list[int]
    lengths: list[tuple[int, ...]]  # tokens of each input
    unit_times: np.ndarray[Any, np.dtype[np.float64]]  # arrivals at 1 request/s
    n_models: int
    burst_s: float = 0.0  # mean on and off period of ``bursty``; 0 for plain Poisson
    seed: int = SEED

    def __len__(self) -> int:
        return len(self.tokens)

    def arrivals(self, rate: float) -> list[float]:
        """Arrival instants at ``rate`` requests/s (mean over on and off periods)."""
        if self.burst_s <= 0:
            plain: list[float] = (self.unit_times / rate).tolist()
            return plain
        # On/off: the same schedule of periods at every rate; arrivals come only in on
        # periods, at twice the mean rate. Time-change the unit-rate stream onto it.
        on_rate = 2.0 * rate
        need = float(self.unit_times[-1]) / on_rate
        rng = np.random.default_rng(self.seed + 7)
        periods = max(16, int(2 * need / self.burst_s) + 16)
        while True:
            durations = rng.exponential(self.burst_s, size=(periods, 2))  # (on, off)
            if durations[:, 0].sum() > need:
                break
            periods *= 2
        on_end_cum = np.cumsum(durations[:, 0])  # on-time elapsed at the end of period j
        on_start = np.concatenate([[0.0], np.cumsum(durations.sum(axis=1))[:-1]])
        x = self.unit_times / on_rate  # on-time elapsed at each arrival
        j = np.searchsorted(on_end_cum, x, side="left")
        before = np.concatenate([[0.0], on_end_cum[:-1]])[j]
        times: list[float] = (on_start[j] + (x - before)).tolist()
        return times


def make_workload(name: str, n: int, cost: CostModel, seed: int = SEED) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    rng = np.random.default_rng(zlib.crc32(name.encode()) + seed)
    if name == "mixed":
        counts = np.minimum(
            MAX_INPUTS, np.floor(rng.random(n) ** (-1.0 / PARETO_ALPHA)).astype(np.int64)
        )
        shares = np.array([s for s, _, _ in LENGTH_MIX])
        bands = rng.choice(len(LENGTH_MIX), size=int(counts.sum()), p=shares / shares.sum())
        low = np.array([lo for _, lo, _ in LENGTH_MIX])[bands]
        high = np.array([hi for _, _, hi in LENGTH_MIX])[bands]
        flat = np.minimum(MODEL_MAX_TOKENS, rng.integers(low, high + 1))
    else:  # 1-3 short inputs: queries, titles
        counts = rng.integers(1, 4, size=n)
        flat = rng.integers(8, 33, size=int(counts.sum()))
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    values = flat.tolist()
    lengths = [tuple(values[bounds[k] : bounds[k + 1]]) for k in range(n)]
    n_models = len(MODEL_SHARES) if name == "multimodel" else 1
    models = (
        rng.choice(n_models, size=n, p=np.array(MODEL_SHARES) / sum(MODEL_SHARES)).tolist()
        if n_models > 1
        else [0] * n
    )
    unit_times = np.cumsum(rng.exponential(1.0, size=n))
    workload = Workload(
        name, models, [sum(x) for x in lengths], lengths, unit_times, n_models, 0.0, seed
    )
    if name == "bursty":
        workload = replace(workload, burst_s=BURST_UNITS * capacity(workload, cost).batch_s)
    return workload


def fill(
    queue: deque[int], tokens: Sequence[int], max_tokens: int, max_requests: int
) -> tuple[list[int], int]:
    """form_batch's fill: requests in queue order up to the budget, skipping (at most
    ``SCAN``) those that do not fit; a request over the whole budget runs alone."""
    chosen: list[int] = []
    total = 0
    skipped: list[int] = []
    while queue and len(chosen) < max_requests:
        i = queue.popleft()
        k = tokens[i]
        if chosen and total + k > max_tokens:
            skipped.append(i)
            if len(skipped) >= SCAN:
                break
            continue
        chosen.append(i)
        total += k
        if total >= max_tokens:
            break
    if skipped:
        queue.extendleft(reversed(skipped))
    return chosen, total


@dataclass(frozen=True)
class Capacity:
    requests_per_s: float  # one worker, every batch full
    requests_per_batch: float
    batch_s: float  # a full batch's mean time: the workload's time unit


def capacity(workload: Workload, cost: CostModel) -> Capacity:
    """What one worker sustains on this workload when every batch is as full as the
    budget allows: the reference for offered load 1.0."""
    queue = deque(range(len(workload)))
    batches = 0
    seconds = 0.0
    while queue:
        chosen, _ = fill(queue, workload.tokens, cost.max_batch_tokens, cost.max_batch_requests)
        seconds += cost.batch_s([n for i in chosen for n in workload.lengths[i]])
        batches += 1
    return Capacity(len(workload) / seconds, len(workload) / batches, seconds / batches)


# -- the simulation ----------------------------------------------------------


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
    rand = rng.random

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
    view = live if staleness_s <= 0 else [0] * workers  # what the router sees
    # least+own: per router, the view plus that router's own sends since it was taken.
    owns = [view if staleness_s <= 0 else [0] * workers for _ in range(routers)]
    least_pick: list[int] = []  # least, stale view: the tied minima of the snapshot
    rr_next = [int(rand() * workers) for _ in range(routers)] if routers > 1 else [0]
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

    def route(i: int) -> int:
        nonlocal least_pick
        if workers == 1:
            return 0
        r = int(rand() * routers) if routers > 1 else 0  # the router this request reaches
        if policy == "rr":
            rr_next[r] += 1
            return (rr_next[r] - 1) % workers
        if policy == "p2c":
            a = int(rand() * workers)
            b = int(rand() * (workers - 1))
            b += b >= a
            return b if view[b] < view[a] else a
        if policy == "least" and staleness_s > 0:
            if not least_pick:
                low = min(view)
                least_pick = [w for w in range(workers) if view[w] == low]
            return least_pick[int(rand() * len(least_pick))]
        # least on a current view, or least+own: the minimum changes with every send.
        # Ties go to the first minimum at or after a random worker (cheap, and random
        # enough: idle workers, all at 0, share the arrivals).
        own = owns[r]
        low = min(own)
        try:
            w = own.index(low, int(rand() * workers))
        except ValueError:
            w = own.index(low)
        if own is not live:
            own[w] += tokens[i] if by_tokens else 1
        return w

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
                view[:] = live
                for own in owns:
                    own[:] = live
                least_pick = []
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
        w = route(i)
        queues[w][m].append(i)
        queued_tokens[w][m] += tokens[i]
        pending[w] += 1
        live[w] += tokens[i] if by_tokens else 1
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


# -- experiments -------------------------------------------------------------


def max_load(
    workload: Workload,
    cost: CostModel,
    *,
    workers: int,
    policy: str,
    staleness_s: float,
    p99_target_s: float,
    seed: int = SEED,
    routers: int = 1,
    tolerance: float = 0.02,
    cap: Capacity | None = None,
) -> tuple[float, SimResult | None]:
    """The highest offered load (fraction of capacity) whose p99 latency stays under
    the target, by bisection on [0, 1] to ``tolerance`` of itself (0.005 at least),
    with the result at that load (None when even the lowest load tried misses)."""
    cap = cap or capacity(workload, cost)
    low, high = 0.0, 1.0
    best: SimResult | None = None
    while high - low > max(tolerance * low, 0.005):
        mid = (low + high) / 2
        result = simulate(
            workload,
            cost,
            workers=workers,
            policy=policy,
            load=mid,
            staleness_s=staleness_s,
            seed=seed,
            p99_target_s=p99_target_s,
            cap=cap,
            routers=routers,
        )
        if not result.aborted and result.p99_s <= p99_target_s:
            low, best = mid, result
        else:
            high = mid
    return low, best


@dataclass(frozen=True)
class Plan:
    cost: CostModel
    workloads: tuple[str, ...]
    workers: tuple[int, ...]
    staleness_ms: tuple[float, ...]
    policies: tuple[str, ...]
    targets: tuple[float, ...]  # p99 targets, in ``target_unit``
    target_unit: str  # "batches" (full-batch times of each workload) or "ms"
    routers: int
    batches: float  # simulated span: this many full-batch times at load 1
    min_requests: int
    max_requests: int
    sweep_loads: tuple[float, ...]
    sweep_workers: int
    sweep_staleness_ms: float
    seed: int = SEED

    def target_s(self, target: float, cap: Capacity) -> float:
        return target * cap.batch_s if self.target_unit == "batches" else target / 1e3

    def requests(self, cap: Capacity, workers: int) -> int:
        wanted = math.ceil(self.batches * workers * cap.requests_per_batch)
        return max(self.min_requests, min(self.max_requests, wanted))


def target_label(target: float, unit: str) -> str:
    return f"{target:g}x batch" if unit == "batches" else f"{target:g} ms"


@dataclass(frozen=True)
class Task:
    kind: str  # "max_load" | "sweep"
    workload: str
    n: int
    workers: int
    policy: str
    staleness_ms: float
    target: str  # its label
    p99_target_s: float
    cost: CostModel
    routers: int = 1
    loads: tuple[float, ...] = ()
    seed: int = SEED


@cache
def _workload(name: str, n: int, cost: CostModel, seed: int) -> tuple[Workload, Capacity]:
    workload = make_workload(name, n, cost, seed)
    return workload, capacity(workload, cost)


def run_task(task: Task) -> list[dict[str, Any]]:
    workload, cap = _workload(task.workload, task.n, task.cost, task.seed)
    common = {
        "workload": task.workload,
        "target": task.target,
        "p99_target_ms": task.p99_target_s * 1e3,
        "routers": task.routers,
    }
    if task.kind == "sweep":
        return [
            {
                **common,
                **asdict(
                    simulate(
                        workload,
                        task.cost,
                        workers=task.workers,
                        policy=task.policy,
                        load=load,
                        staleness_s=task.staleness_ms / 1e3,
                        seed=task.seed,
                        cap=cap,
                        routers=task.routers,
                    )
                ),
            }
            for load in task.loads
        ]
    load, result = max_load(
        workload,
        task.cost,
        workers=task.workers,
        policy=task.policy,
        staleness_s=task.staleness_ms / 1e3,
        p99_target_s=task.p99_target_s,
        seed=task.seed,
        routers=task.routers,
        cap=cap,
    )
    row: dict[str, Any] = {
        **common,
        "workers": task.workers,
        "policy": task.policy,
        "staleness_ms": task.staleness_ms,
        "max_load": load,
        "requests_per_s": load * task.workers * cap.requests_per_s,
        "requests_simulated": task.n,
    }
    if result is not None:
        row.update(
            {
                "tokens_per_s": result.tokens_per_s,
                "utilization": result.utilization,
                "p50_ms": result.p50_s * 1e3,
                "p99_ms": result.p99_s * 1e3,
                "batch_requests": result.batch_requests,
                "batch_tokens": result.batch_tokens,
            }
        )
    return [row]


def workload_facts(plan: Plan) -> dict[str, dict[str, Any]]:
    """Per workload: capacity, time unit, request sizes, p99 targets, requests to run."""
    facts: dict[str, dict[str, Any]] = {}
    for name in plan.workloads:
        workload, cap = _workload(name, 20_000, plan.cost, plan.seed)
        facts[name] = {
            "capacity_requests_per_s_per_worker": cap.requests_per_s,
            "full_batch_requests": cap.requests_per_batch,
            "full_batch_ms": cap.batch_s * 1e3,
            "mean_request_tokens": float(np.mean(workload.tokens)),
            "p99_request_tokens": float(np.percentile(workload.tokens, 99)),
            "mean_inputs": float(np.mean([len(x) for x in workload.lengths])),
            "models": workload.n_models,
            "burst_ms": workload.burst_s * 1e3,
            "p99_targets_ms": {
                target_label(t, plan.target_unit): plan.target_s(t, cap) * 1e3 for t in plan.targets
            },
            "requests": {
                str(w): plan.requests(cap, w) for w in sorted({*plan.workers, plan.sweep_workers})
            },
        }
    return facts


def tasks_for(plan: Plan, facts: dict[str, dict[str, Any]]) -> list[Task]:
    tasks: list[Task] = []
    for name in plan.workloads:
        targets = facts[name]["p99_targets_ms"]
        for label, target_ms in targets.items():
            for workers in plan.workers:
                n = facts[name]["requests"][str(workers)]
                for policy in plan.policies:
                    for r in plan.staleness_ms if policy in VIEW_POLICIES else (0.0,):
                        tasks.append(
                            Task(
                                "max_load",
                                name,
                                n,
                                workers,
                                policy,
                                r,
                                label,
                                target_ms / 1e3,
                                plan.cost,
                                plan.routers,
                                seed=plan.seed,
                            )
                        )
        if plan.sweep_loads:
            label, target_ms = next(iter(targets.items()))
            n = facts[name]["requests"][str(plan.sweep_workers)]
            for policy in plan.policies:
                r = plan.sweep_staleness_ms if policy in VIEW_POLICIES else 0.0
                tasks.append(
                    Task(
                        "sweep",
                        name,
                        n,
                        plan.sweep_workers,
                        policy,
                        r,
                        label,
                        target_ms / 1e3,
                        plan.cost,
                        plan.routers,
                        plan.sweep_loads,
                        plan.seed,
                    )
                )
    # The biggest first, so that the pool's processes finish together.
    tasks.sort(key=lambda t: -t.n * (len(t.loads) or 4))
    return tasks


def run_plan(plan: Plan, jobs: int) -> dict[str, Any]:
    started = time.perf_counter()
    facts = workload_facts(plan)
    tasks = tasks_for(plan, facts)
    rows: list[dict[str, Any]] = []
    step = max(1, len(tasks) // 10)

    def progress(done: int) -> None:
        if done % step == 0 or done == len(tasks):
            elapsed = time.perf_counter() - started
            print(f"  {done}/{len(tasks)} simulations done, {elapsed:.0f} s", flush=True)

    if jobs <= 1:
        for done, task in enumerate(tasks, 1):
            rows.extend(run_task(task))
            progress(done)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_task, task) for task in tasks]
            for done, future in enumerate(as_completed(futures), 1):
                rows.extend(future.result())
                progress(done)
    best = [r for r in rows if "max_load" in r]
    sweep = [r for r in rows if "max_load" not in r]
    best.sort(
        key=lambda r: (
            r["workload"],
            r["p99_target_ms"],
            r["workers"],
            POLICIES.index(r["policy"]),
            r["staleness_ms"],
        )
    )
    sweep.sort(key=lambda r: (r["workload"], POLICIES.index(r["policy"]), r["load"]))
    plan_dict = asdict(plan)
    del plan_dict["cost"]
    return {
        "benchmark": "cluster_sim",
        "cost_model": asdict(plan.cost),
        "plan": plan_dict,
        "workloads": facts,
        "max_load": best,
        "ratios": ratios(best),
        "sweep": sweep,
        "host": {"cpu": report.cpu_model(), "cores": os.cpu_count(), "jobs": jobs},
        "elapsed_s": time.perf_counter() - started,
    }


def ratios(best: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pull's max load over each push policy's, per workload, target, workers, staleness."""
    pull = {(r["workload"], r["target"], r["workers"]): r for r in best if r["policy"] == "pull"}
    out = []
    for r in best:
        p = pull.get((r["workload"], r["target"], r["workers"]))
        if r["policy"] == "pull" or p is None:
            continue
        out.append(
            {
                "workload": r["workload"],
                "target": r["target"],
                "p99_target_ms": r["p99_target_ms"],
                "workers": r["workers"],
                "policy": r["policy"],
                "staleness_ms": r["staleness_ms"],
                "pull_max_load": p["max_load"],
                "push_max_load": r["max_load"],
                "pull_over_push": p["max_load"] / r["max_load"] if r["max_load"] else math.inf,
                "pull_utilization": p.get("utilization"),
                "push_utilization": r.get("utilization"),
            }
        )
    return out


# -- command line ------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cluster.engine",
        description="Push versus pull: throughput at a p99 latency target, simulated.",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="default 8 16 32 64")
    parser.add_argument(
        "--staleness-ms", type=float, nargs="+", default=None, help="default 0 5 20 50 100 200"
    )
    parser.add_argument("--workload", nargs="+", choices=WORKLOADS, default=None)
    parser.add_argument("--policy", nargs="+", choices=PUSH, default=None, help="push policies")
    parser.add_argument(
        "--p99-ms", type=float, nargs="+", default=None, help="p99 targets, the same for all"
    )
    parser.add_argument(
        "--p99-batches",
        type=float,
        nargs="+",
        default=[2.0, 4.0],
        help="p99 targets in full-batch times of each workload (when no --p99-ms)",
    )
    parser.add_argument("--routers", type=int, default=1, help="independent push routers")
    parser.add_argument(
        "--cost",
        choices=["cpu", "gpu-like"],
        default="cpu",
        help="cpu: the measured fit (bench/results/cluster_calibration.json, else the "
        "built-in fallback); gpu-like: HYPOTHETICAL scaling of it (see bench.cluster.calibrate)",
    )
    parser.add_argument(
        "--gpu-speedup",
        type=float,
        default=GPU_PER_TOKEN_DIVISOR,
        help="gpu-like: the measured per-token cost divided by this (HYPOTHETICAL)",
    )
    parser.add_argument(
        "--gpu-fixed-factor",
        type=float,
        default=GPU_FIXED_FACTOR,
        help="gpu-like: the measured fixed per-batch cost times this (HYPOTHETICAL)",
    )
    parser.add_argument("--calibration", type=Path, default=None, help="a calibration JSON")
    parser.add_argument("--batches", type=float, default=None, help="simulated full-batch times")
    parser.add_argument("--max-requests", type=int, default=None, help="per simulation")
    parser.add_argument("--sweep-workers", type=int, default=None)
    parser.add_argument("--sweep-staleness-ms", type=float, default=50.0)
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="a small grid in seconds")
    parser.add_argument("--out", default="cluster_sim", help="name of the JSON and PNG files")
    parser.add_argument("--out-dir", type=Path, default=None, help="default bench/results")
    return parser.parse_args(argv)


def plan_from(args: argparse.Namespace) -> Plan:
    cost = load_cost(args.calibration)
    if args.cost == "gpu-like":
        cost = gpu_like(cost, args.gpu_speedup, args.gpu_fixed_factor)
    quick = args.quick
    workers = tuple(args.workers or ((8, 16) if quick else (8, 16, 32, 64)))
    default_staleness = (0.0, 20.0, 100.0) if quick else (0.0, 5.0, 20.0, 50.0, 100.0, 200.0)
    loads = (0.3, 0.6, 0.8, 0.9) if quick else (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    return Plan(
        cost=cost,
        workloads=tuple(args.workload or WORKLOADS),
        workers=workers,
        staleness_ms=tuple(args.staleness_ms or default_staleness),
        policies=("pull", *(args.policy or PUSH)),
        targets=tuple(args.p99_ms or args.p99_batches),
        target_unit="ms" if args.p99_ms else "batches",
        routers=args.routers,
        batches=args.batches or (8.0 if quick else 15.0),
        min_requests=2_000 if quick else 10_000,
        max_requests=args.max_requests or (20_000 if quick else 150_000),
        sweep_loads=() if args.no_sweep else loads,
        sweep_workers=args.sweep_workers or (32 if 32 in workers else max(workers)),
        sweep_staleness_ms=args.sweep_staleness_ms,
        seed=args.seed,
    )


def main(argv: list[str] | None = None) -> int:
    from bench.cluster import sim_report

    args = parse_args(argv)
    plan = plan_from(args)
    if plan.cost.source == "fallback":
        print(
            "  (no bench/results/cluster_calibration.json: run python -m bench.cluster.calibrate)"
        )
    data = run_plan(plan, args.jobs)
    print(sim_report.tables(data))
    out_dir = args.out_dir or report.results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{args.out}.json"
    path.write_text(sim_report.json_text(data), encoding="utf-8")
    written = [path, *sim_report.plots(data, out_dir, args.out)]
    print(f"\n{data['elapsed_s']:.0f} s; wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
