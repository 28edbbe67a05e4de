"""A slow pull worker's batch under per-request deadlines: leave to a faster device
what only it can finish in time.

The worker forms its batch as usual (``workloads.fill``), then leaves out each request
that the batch, run at its speed, would finish after the request's deadline while a
faster host of the model, running the same batch as soon as it is free, would finish
it in time: ``t + slow * run > deadline >= max(t, free) + fast * run``, ``run`` the
batch's time at speed 1 (fixed cost plus its tokens, padding left out). A request no
host finishes in time any more is anyone's. The faster host's finishing brings the
shared queue a look anyway; a wake-up covers one that is free already but not due.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence

from bench.cluster.workloads import fill


def fill_in_time(
    queue: deque[int],
    tokens: Sequence[int],
    max_tokens: int,
    max_requests: int,
    *,
    t: float,
    deadline_at: Sequence[float],
    run_s: Callable[[int], float],
    slow: float,
    faster: Sequence[tuple[float, float]],
) -> tuple[list[int], int, float]:
    """``fill``'s batch at ``t`` for a worker ``slow`` times slower than speed 1, less the
    requests it leaves to a faster host of the model (back in the queue, in order);
    ``faster``: those hosts, each (free from, slowdown); ``run_s(tokens)``: a batch's time
    at speed 1. Also returns when to look again (inf: nothing left)."""
    chosen, total = fill(queue, tokens, max_tokens, max_requests)
    if not faster or not chosen:
        return chosen, total, math.inf
    run = run_s(total)
    late = t + slow * run
    fine = min(max(t, free) + s * run for free, s in faster)
    left = [i for i in chosen if late > deadline_at[i] >= fine]
    if not left:
        return chosen, total, math.inf
    kept = [i for i in chosen if not late > deadline_at[i] >= fine]
    # The queue is in arrival order, which is index order: put those left back in it.
    ahead: list[int] = []
    while queue and queue[0] < left[-1]:
        ahead.append(queue.popleft())
    queue.extendleft(sorted([*ahead, *left], reverse=True))
    # Past this, that host (if free now) no longer finishes the first of them in time.
    wake = min(deadline_at[i] for i in left) - (fine - t)
    return kept, sum(tokens[i] for i in kept), math.nextafter(wake, math.inf)
