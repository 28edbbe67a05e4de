"""How a request finds a worker: the five policies the study compares.

- ``pull``: one shared queue; a free worker forms its batch from it. It places
  nothing, so it has no picker here: the engine's shared queue (simulated) or
  JetStream's shared work queue (real) is the policy.
- ``rr`` (push): a router sends request k to worker k mod n; it reads no view.
- ``least`` (push): to the worker with the least outstanding load (queued plus
  running) in the router's view, ties broken at random.
- ``p2c`` (push): the lesser-loaded of two distinct random workers in that view
  (with two workers that is always both, i.e. ``least``).
- ``least+own`` (push): ``least`` on the view plus what this router itself sent
  each worker since the view was taken (a router that counts its own
  assignments; it still cannot see completions until the next view).

The router's view is a snapshot of every worker's load taken every R ms and stale
in between; in the simulation R = 0 is a perfect, always-current view. Where each
worker hosts only some models, a policy chooses among the request's model's hosts
only, reading their part of the view (round-robin keeping one turn per model).

Each push policy comes in two forms that read and choose the same way:
``SimRouter`` for the simulation (integer loads, cheap tie-breaking fixed by the
run's seed) and the pickers over ``Routing`` for ``bench.cluster.router``, the
real HTTP router (a view polled from the workers' ``/metrics``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

POLICIES = ("pull", "rr", "least", "p2c", "least+own")
PUSH = POLICIES[1:]
VIEW_POLICIES = frozenset({"least", "p2c", "least+own"})  # those that read the load view


# -- simulated ---------------------------------------------------------------


class SimRouter:
    """The simulation's push routers, placing one request at a time.

    ``live`` is the engine's outstanding load per worker, which the engine keeps
    current as requests arrive and batches finish; a current view (``stale`` false)
    is that very list, a stale one a copy that ``refresh`` retakes. ``routers``
    independent routers (gateway replicas) each keep their own round-robin turn and
    their own sends (``least+own``) and share the snapshot; each request reaches one
    at random. Every random draw comes from ``rand``, in the order the engine has
    always made them, so that a seed gives the same run.
    """

    __slots__ = ("least_pick", "least_within", "live", "owns", "policy", "rand", "routers",
                 "rr_next", "stale", "turns", "view", "workers")  # fmt: skip

    def __init__(
        self,
        policy: str,
        workers: int,
        routers: int,
        stale: bool,
        live: list[int],
        rand: Callable[[], float],
    ) -> None:
        self.policy = policy
        self.workers = workers
        self.routers = routers
        self.stale = stale
        self.live = live
        self.rand = rand
        self.view = [0] * workers if stale else live  # what the routers see
        # least+own: per router, the view plus that router's own sends since it was taken.
        self.owns = [[0] * workers if stale else self.view for _ in range(routers)]
        self.least_pick: list[int] = []  # least, stale view: the tied minima of the snapshot
        self.rr_next = [int(rand() * workers) for _ in range(routers)] if routers > 1 else [0]
        # route_within: per router, one round-robin turn per model (as the real router
        # keeps); least on a stale view, the tied minima among each model's hosts.
        self.turns: list[dict[int, int]] = [{} for _ in range(routers)]
        self.least_within: dict[int, list[int]] = {}

    def refresh(self) -> None:
        """A new snapshot of every worker's load."""
        live = self.live
        self.view[:] = live
        for own in self.owns:
            own[:] = live
        self.least_pick = []
        self.least_within = {}

    def route(self, load: int) -> int:
        """The worker for a request that adds ``load`` (tokens or 1) to it."""
        workers, rand = self.workers, self.rand
        if workers == 1:
            return 0
        r = int(rand() * self.routers) if self.routers > 1 else 0  # the router it reaches
        policy = self.policy
        if policy == "rr":
            self.rr_next[r] += 1
            return (self.rr_next[r] - 1) % workers
        if policy == "p2c":
            view = self.view
            a = int(rand() * workers)
            b = int(rand() * (workers - 1))
            b += b >= a
            return b if view[b] < view[a] else a
        if policy == "least" and self.stale:
            if not self.least_pick:
                view = self.view
                low = min(view)
                self.least_pick = [w for w in range(workers) if view[w] == low]
            return self.least_pick[int(rand() * len(self.least_pick))]
        # least on a current view, or least+own: the minimum changes with every send.
        # Ties go to the first minimum at or after a random worker (cheap, and random
        # enough: idle workers, all at 0, share the arrivals).
        own = self.owns[r]
        low = min(own)
        try:
            w = own.index(low, int(rand() * workers))
        except ValueError:
            w = own.index(low)
        if own is not self.live:
            own[w] += load
        return w

    def route_within(self, load: int, hosts: Sequence[int], model: int) -> int:
        """The worker among ``hosts`` (those hosting ``model``) for a request that adds
        ``load``: the same policy over the hosts only, as ``bench.cluster.router`` places."""
        rand, n = self.rand, len(hosts)
        r = int(rand() * self.routers) if self.routers > 1 else 0
        policy = self.policy
        if policy == "rr":
            turns = self.turns[r]
            # Several routers start their turns anywhere, as route's do.
            turn = turns.get(model, int(rand() * n) if self.routers > 1 else 0)
            turns[model] = turn + 1
            return hosts[turn % n]
        view = self.view
        if policy == "p2c":
            if n == 1:
                return hosts[0]
            a = int(rand() * n)
            b = int(rand() * (n - 1))
            b += b >= a
            return hosts[b] if view[hosts[b]] < view[hosts[a]] else hosts[a]
        if policy == "least" and self.stale:
            picks = self.least_within.get(model)
            if not picks:
                low = min(view[h] for h in hosts)
                picks = self.least_within[model] = [h for h in hosts if view[h] == low]
            return picks[int(rand() * len(picks))]
        own = self.owns[r]
        loads = [own[h] for h in hosts]
        low = min(loads)
        try:
            k = loads.index(low, int(rand() * n))
        except ValueError:
            k = loads.index(low)
        w = hosts[k]
        if own is not self.live:
            own[w] += load
        return w


# -- real: what bench.cluster.router places by ---------------------------------


@dataclass
class Routing:
    """What a policy may read when it places one request."""

    workers: int
    view: list[float]  # outstanding tokens per worker at the last poll
    sent_since_view: list[int]  # tokens this router sent each worker since that poll began
    turn: int = 0  # requests placed so far


def _least(loads: Sequence[float], rng: random.Random) -> int:
    low = min(loads)
    return rng.choice([i for i, load in enumerate(loads) if load == low])


def round_robin(r: Routing, rng: random.Random) -> int:
    return r.turn % r.workers


def least_loaded(r: Routing, rng: random.Random) -> int:
    return _least(r.view, rng)


def power_of_two(r: Routing, rng: random.Random) -> int:
    if r.workers < 2:
        return 0
    a, b = rng.sample(range(r.workers), 2)
    return (a, b)[_least([r.view[a], r.view[b]], rng)]


def least_with_own(r: Routing, rng: random.Random) -> int:
    return _least([v + s for v, s in zip(r.view, r.sent_since_view, strict=True)], rng)


Policy = Callable[[Routing, random.Random], int]
