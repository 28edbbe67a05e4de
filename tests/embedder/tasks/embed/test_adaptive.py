"""WaitController: step responses, anti-windup, idle decay, the budget factor, bounds over
random histories; flushed_full; and the controller in a worker with a fake clock."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
from collections.abc import AsyncIterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedder.core.jobs import ApiShape, Job, JobResult
from embedder.host import ModelHost
from embedder.queue.inprocess import InProcessQueue
from embedder.serving.pulling import IDLE_POLL_S
from embedder.tasks.embed.adaptive import Gains, WaitController, flushed_full
from embedder.tasks.embed.batching import BatchLimits, form_batch
from embedder.tasks.embed.codecs import RequestLimits
from embedder.tasks.embed.engine import LoadedEncoders
from embedder.tasks.embed.execute import LoadedModel
from embedder.tasks.embed.runtimes import Encoded
from embedder.tasks.embed.worker import Worker
from embedder.tasks.fleet import parse_fleet
from embedder.tasks.registry import encoder_loaders
from tests.embedder.tasks.embed.test_batching import job
from tests.fakes import FakeLoader, FakeRuntime, fake_fleet

TARGET = 0.010
WAIT_S = 5.0  # upper bound for anything a test awaits
MAX_WAIT = 0.004
SERVICE = 0.002  # what a batch costs in these plants
GAINS = Gains()


def controller(
    *, gains: Gains = GAINS, idle_after_s: float = 1.0, initial_s: float = 0.0
) -> WaitController:
    return WaitController(
        TARGET, MAX_WAIT, gains=gains, idle_after_s=idle_after_s, initial_s=initial_s
    )


def step(c: WaitController, latency: float, *, requests: int = 4, full: bool = False) -> float:
    """One batch formed and delivered, every job taking ``latency``."""
    c.formed(requests, full)
    return c.delivered([latency] * requests, now=0.0)


def run_plant(
    c: WaitController, latency_of_wait: float, steps: int, **batch: object
) -> list[float]:
    """Closed loop on a plant whose latency is ``SERVICE + share * wait``."""
    waits = []
    for _ in range(steps):
        waits.append(step(c, SERVICE + latency_of_wait * c.wait_s, **batch))  # type: ignore[arg-type]
    return waits


def within_bounds(waits: Sequence[float]) -> bool:
    return all(0.0 <= w <= MAX_WAIT for w in waits)


# -- step responses --------------------------------------------------------------------


def test_over_target_with_timer_batches_the_wait_falls_to_zero_and_stays_there() -> None:
    c = controller(initial_s=MAX_WAIT)
    waits = [step(c, 3 * TARGET) for _ in range(200)]
    assert within_bounds(waits)
    assert all(b <= a for a, b in pairwise(waits))  # monotonic: no overshoot back up
    assert waits[40:] == [0.0] * 160


def test_under_target_with_company_the_wait_rises_to_max_wait_and_not_beyond() -> None:
    c = controller()
    waits = [step(c, SERVICE) for _ in range(200)]
    assert within_bounds(waits)
    assert waits[0] > 0.0
    assert all(b >= a for a, b in pairwise(waits))
    assert waits[-1] == MAX_WAIT


def test_closed_loop_settles_where_p50_meets_the_target() -> None:
    # Max wait far above what the target allows: the loop must stop inside, at p50 = target.
    c = WaitController(TARGET, 0.050)
    waits = run_plant(c, 0.5, 600)
    settled = waits[-1]
    assert SERVICE + 0.5 * settled == pytest.approx(TARGET, rel=0.02)
    assert max(waits) < 0.050  # never ran to the clamp on the way
    assert max(waits) <= settled * 1.15  # and overshot little


def test_one_client_alone_gets_no_wait_even_far_under_target() -> None:
    # Every batch holds one request: waiting gathers nobody, so headroom is not spent on it.
    c = controller(initial_s=MAX_WAIT)
    waits = run_plant(c, 1.0, 60, requests=1)
    assert waits[-1] == 0.0
    assert SERVICE + MAX_WAIT < TARGET  # the target alone would have allowed the full wait


def test_full_batches_over_target_keep_the_wait_instead_of_collapsing_it() -> None:
    # Saturation: p50 is queueing, batches flush on full; a shorter wait would only split them.
    c = controller(initial_s=MAX_WAIT)
    waits = [step(c, 10 * TARGET, requests=64, full=True) for _ in range(100)]
    assert waits == [MAX_WAIT] * 100


def test_full_batches_under_target_let_the_wait_grow() -> None:
    c = controller()
    waits = [step(c, SERVICE, requests=64, full=True) for _ in range(200)]
    assert waits[-1] == MAX_WAIT


def test_partly_full_batches_shrink_the_wait_by_the_share_that_waited() -> None:
    all_timed, half_full = controller(initial_s=MAX_WAIT), controller(initial_s=MAX_WAIT)
    for i in range(10):
        step(all_timed, 2 * TARGET)
        step(half_full, 2 * TARGET, full=i % 2 == 0)
    assert 0.0 <= all_timed.wait_s < half_full.wait_s < MAX_WAIT


# -- anti-windup -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pinning_latency", "recovery_latency", "initial"),
    [(5 * TARGET, SERVICE, 0.0), (SERVICE, 5 * TARGET, MAX_WAIT)],
    ids=["pinned-at-zero", "pinned-at-max"],
)
def test_after_a_long_clamp_recovery_is_as_prompt_as_from_a_fresh_start(
    pinning_latency: float, recovery_latency: float, initial: float
) -> None:
    pinned, fresh = controller(initial_s=initial), controller(initial_s=initial)
    for _ in range(5000):
        step(pinned, pinning_latency)
    assert pinned.wait_s == initial
    for _ in range(32):  # both windows now hold only recovery latencies
        step(fresh, recovery_latency)
        step(pinned, recovery_latency)
    # A wound-up integral would still sit behind its clamp here.
    assert pinned.wait_s == pytest.approx(fresh.wait_s)
    assert pinned.wait_s != initial


# -- idle ------------------------------------------------------------------------------


def test_idle_decays_the_wait_toward_zero_after_idle_after_s_and_forgets_old_latencies() -> None:
    c = controller(idle_after_s=1.0)
    for i in range(200):
        c.formed(4, False)
        c.delivered([SERVICE] * 4, now=i * 0.01)
    last = 199 * 0.01
    assert c.wait_s == MAX_WAIT
    assert c.idle(last + 0.5) == MAX_WAIT  # a pause is not yet a lull
    waits = [c.idle(last + 1.0 + t) for t in (0.5, 1.0, 2.0, 8.0)]
    assert all(b < a for a, b in pairwise([MAX_WAIT, *waits]))
    assert waits[1] == pytest.approx(MAX_WAIT * math.exp(-1.0))
    assert waits[-1] < MAX_WAIT * 1e-3
    assert c.p50_s is None  # the old burst's latencies do not steer the next one
    c.formed(1, False)
    c.delivered([0.123], now=last + 20)
    assert c.p50_s == 0.123


def test_idle_before_any_delivery_keeps_the_initial_wait() -> None:
    assert controller(initial_s=0.001).idle(1e9) == 0.001


def test_each_lull_decays_from_its_own_start() -> None:
    c = controller(idle_after_s=1.0, initial_s=MAX_WAIT)
    c.formed(4, False)
    c.delivered([TARGET], now=0.0)  # exactly on target: no change
    assert c.wait_s == MAX_WAIT
    c.idle(3.0)  # two seconds of lull
    after_first = c.wait_s
    for t in (3.5, 4.0):  # repeated calls do not decay twice over the same time
        c.idle(t)
    assert c.wait_s == pytest.approx(MAX_WAIT * math.exp(-3.0))
    assert after_first == pytest.approx(MAX_WAIT * math.exp(-2.0))


# -- the budget factor -----------------------------------------------------------------


def test_batches_the_budget_did_not_bound_leave_the_budget_alone() -> None:
    c = controller()
    for latency in (10 * TARGET, SERVICE, 3 * TARGET):
        for _ in range(50):
            step(c, latency, full=False)
        assert c.budget_factor == 1.0


def test_full_batches_over_target_shrink_the_budget_to_its_floor_and_not_below() -> None:
    c = controller()
    factors = []
    for _ in range(200):
        step(c, 3 * TARGET, full=True)
        factors.append(c.budget_factor)
    assert all(b <= a for a, b in pairwise([1.0, *factors]))
    assert factors[0] == pytest.approx(math.exp(-GAINS.kb))  # relative error clamped at -1
    assert factors[-1] == c.min_budget_factor == 0.5


def test_full_batches_under_target_grow_the_budget_back_to_the_pace_bound() -> None:
    c = controller()
    for _ in range(200):
        step(c, 3 * TARGET, full=True)
    for _ in range(32):  # the window now holds only latencies under target
        step(c, TARGET / 2, full=True)
    grown = c.budget_factor
    assert grown > c.min_budget_factor
    for _ in range(200):
        step(c, TARGET / 2, full=True)
    assert c.budget_factor == 1.0


def test_the_budget_moves_by_the_share_of_full_batches() -> None:
    all_full, half_full = controller(), controller()
    for i in range(10):
        step(all_full, 2 * TARGET, full=True)
        step(half_full, 2 * TARGET, full=i % 2 == 0)
    # At twice the target the relative error is -1: each step moves the log by kb x share.
    assert math.log(all_full.budget_factor) == pytest.approx(-10 * GAINS.kb)
    shares = [math.ceil((i + 1) / 2) / (i + 1) for i in range(10)]  # full, half, 2/3, ...
    assert math.log(half_full.budget_factor) == pytest.approx(-GAINS.kb * sum(shares))


def test_a_lull_relaxes_the_budget_back_toward_the_pace_bound() -> None:
    c = controller(idle_after_s=1.0)
    for i in range(100):
        c.formed(4, True)
        c.delivered([3 * TARGET] * 4, now=i * 0.01)
    shrunk = c.budget_factor
    assert shrunk == 0.5
    last = 99 * 0.01
    assert c.idle(last + 0.5) is not None and c.budget_factor == shrunk  # not yet a lull
    c.idle(last + 2.0)
    assert c.budget_factor == pytest.approx(1 - (1 - shrunk) * math.exp(-1.0))
    c.idle(last + 20.0)
    assert c.budget_factor == pytest.approx(1.0, abs=1e-6)


# -- bounds and inputs -----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 1.0),  # latency
            st.integers(1, 64),  # requests
            st.booleans(),  # full
            st.floats(0.0, 5.0),  # time since the previous event
            st.booleans(),  # an idle check instead of a delivery
        ),
        max_size=80,
    ),
    st.floats(0.0, 0.1),
)
def test_the_wait_stays_within_zero_and_max_wait_whatever_happens(
    events: list[tuple[float, int, bool, float, bool]], initial: float
) -> None:
    c = controller(initial_s=initial)
    now = 0.0
    for latency, requests, full, gap, idle in events:
        now += gap
        if idle:
            wait = c.idle(now)
        else:
            c.formed(requests, full)
            wait = c.delivered([latency] * requests, now)
        assert 0.0 <= wait <= MAX_WAIT
        assert wait == c.wait_s
        assert c.min_budget_factor <= c.budget_factor <= 1.0


def test_no_data_means_no_error() -> None:
    c = controller()
    assert c.error_s() == 0.0
    c.formed(3, False)
    assert c.error_s() == 0.0  # batches formed, none delivered yet
    assert c.delivered([], now=0.0) == 0.0


def test_gains_scale_the_step() -> None:
    slow, fast = controller(gains=Gains(kp=0.0, ki=0.01)), controller(gains=Gains(kp=0.0, ki=0.1))
    step(slow, SERVICE)
    step(fast, SERVICE)
    assert fast.wait_s == pytest.approx(10 * slow.wait_s)
    assert slow.wait_s == pytest.approx(0.01 * (TARGET - SERVICE))


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        ((0.0, 0.01), {}, "latency target must be positive"),
        ((0.01, -1.0), {}, "max_wait must not be negative"),
        ((0.01, 0.01), {"window": 0}, "at least one entry"),
        ((0.01, 0.01), {"idle_after_s": 0.0}, "idle_after_s must be positive"),
        ((0.01, 0.01), {"min_budget_factor": 0.0}, "min_budget_factor must be in"),
        ((0.01, 0.01), {"min_budget_factor": 1.5}, "min_budget_factor must be in"),
    ],
)
def test_bad_settings_are_refused(
    args: tuple[float, float], kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        WaitController(*args, **kwargs)


# -- flushed_full ----------------------------------------------------------------------

LIMITS = {m: BatchLimits(max_tokens=100, max_requests=4, max_wait_s=1.0) for m in ("a", "b")}
MIXED = [*(job(str(i), model="a") for i in range(3)), job("3", model="a", adapter="x")]
MIXED += [job("4", model="a", adapter="x")]


@pytest.mark.parametrize(
    ("pending", "full"),
    [
        ([job("1", model="a")], False),
        ([job(str(i), model="a") for i in range(3)], False),
        ([job(str(i), model="a") for i in range(4)], True),  # the request limit
        ([job(str(i), model="a") for i in range(5)], True),
        ([job("1", model="a", tokens=100)], True),  # the token budget
        ([job("1", model="a", tokens=60), job("2", model="a", tokens=60)], True),  # a leftover
        ([job("1", model="a"), job("2", model="b")], False),  # another model waits: not ours
        ([*MIXED], True),  # with mixing, adapters share the group: a leftover
    ],
)
def test_flushed_full_tells_budget_bound_batches_from_waited_ones(
    pending: list[Job], full: bool
) -> None:
    limits = LIMITS | {"a": BatchLimits(100, 4, 1.0, mix_adapters=True)}
    plan = form_batch(pending, limits, now=1_000.0)
    assert flushed_full(plan, limits) is full


def test_an_adapter_of_its_own_group_left_over_is_not_a_full_batch() -> None:
    plan = form_batch(MIXED, LIMITS, 1_000.0)  # no mixing here: base and adapter apart
    assert len(plan.batch) == 3
    assert not flushed_full(plan, LIMITS)


# -- in the worker, with a fake clock --------------------------------------------------


class FakeClock:
    """Time moves only when the test says; a job that must wait max_wait never runs
    unless the clock is advanced."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def send(
    queue: InProcessQueue, clock: FakeClock, n: int, tag: str
) -> list[asyncio.Future[JobResult]]:
    futures = []
    for i in range(n):
        body = json.dumps({"inputs": [f"{tag} {i}"]}).encode()
        job_ = Job(
            id=f"{tag}-{i}",
            model="alpha",
            shape=ApiShape.TEI_EMBED,
            body=body,
            est_tokens=4,
            deadline=clock.now + 1e6,
            enqueued_at=clock.now,
        )
        futures.append(await queue.put(job_))
    return futures


async def served_after(clock: FakeClock, futures: list[asyncio.Future[JobResult]]) -> float:
    """Fake seconds until every future is done, advancing the clock 1 ms per real poll."""
    start = clock.now
    for _ in range(5_000):
        if all(f.done() for f in futures):
            return clock.now - start
        await asyncio.sleep(0.001)
        if not all(f.done() for f in futures):
            clock.now += 0.001
    raise AssertionError("jobs were not served")


STEERED = BatchLimits(max_tokens=512, max_requests=16, max_wait_s=0.050, latency_target_s=0.2)


@contextlib.asynccontextmanager
async def grown_wait(
    runtime: FakeRuntime,
) -> AsyncIterator[tuple[Worker, InProcessQueue, FakeClock]]:
    """A steered worker after groups of four arrived together, well under target: waiting
    paid, so its wait grew."""
    clock = FakeClock()
    queue = InProcessQueue()
    models = {"alpha": LoadedModel(runtime.spec, runtime, STEERED)}
    async with Worker(queue, models, RequestLimits(), clock=clock) as worker:
        for round_ in range(40):
            await served_after(clock, await send(queue, clock, 4, f"group{round_}"))
        yield worker, queue, clock


async def test_in_the_worker_one_client_stops_waiting_and_a_burst_still_fills_a_batch() -> None:
    runtime = FakeRuntime(fake_fleet("alpha").models["alpha"])
    async with grown_wait(runtime) as (worker, queue, clock):
        assert worker.limits["alpha"].max_wait_s == pytest.approx(0.050)
        # One client, one request at a time: it first waits the whole 50 ms, then no longer.
        latencies = [
            await served_after(clock, await send(queue, clock, 1, f"alone{i}")) for i in range(30)
        ]
        assert latencies[0] >= 0.040
        assert max(latencies[-10:]) <= 0.002
        assert worker.limits["alpha"].max_wait_s == 0.0
        # A burst of sixteen still forms one full batch.
        calls_before = len(runtime.forward_calls)
        await served_after(clock, await send(queue, clock, 16, "burst"))
    assert runtime.forward_calls[calls_before:] == [16]


async def test_a_model_without_target_keeps_its_fixed_wait() -> None:
    spec = fake_fleet("alpha").models["alpha"]
    limits = BatchLimits(max_tokens=512, max_requests=16, max_wait_s=0.010)
    clock = FakeClock()
    queue = InProcessQueue()
    worker = Worker(
        queue, {"alpha": LoadedModel(spec, FakeRuntime(spec), limits)}, RequestLimits(), clock=clock
    )
    async with worker:
        latencies = [
            await served_after(clock, await send(queue, clock, 1, f"alone{i}")) for i in range(5)
        ]
    assert worker.limits["alpha"] == limits
    assert all(latency >= 0.009 for latency in latencies)


class GatedRuntime(FakeRuntime):
    """A forward pass that holds until the test opens the gate."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.inside = threading.Event()

    def forward(self, encoded: Encoded, adapters: Sequence[str | None] | None = None) -> Any:
        self.inside.set()
        self.gate.wait(WAIT_S)
        return super().forward(encoded, adapters)


async def test_in_the_worker_a_lull_relaxes_the_wait_but_a_long_batch_in_flight_does_not() -> None:
    runtime = GatedRuntime(fake_fleet("alpha").models["alpha"])
    async with grown_wait(runtime) as (worker, queue, clock):
        grown = worker.limits["alpha"].max_wait_s
        assert grown > 0.02
        runtime.gate.clear()
        runtime.inside.clear()
        slow = await send(queue, clock, 1, "slow")
        while not runtime.inside.is_set():  # the lone job waits its wait, then runs
            await asyncio.sleep(0.001)
            clock.now += 0.001
        clock.now += 10.0  # ten seconds with a batch in flight and nothing else
        await asyncio.sleep(3 * IDLE_POLL_S)
        assert worker.limits["alpha"].max_wait_s == grown
        runtime.gate.set()
        await asyncio.wait_for(slow[0], WAIT_S)
        clock.now += 10.0  # now truly idle: the wait relaxes toward 0
        await asyncio.sleep(3 * IDLE_POLL_S)
        assert worker.limits["alpha"].max_wait_s < grown * 1e-3


async def test_the_host_hands_the_profiles_latency_target_to_the_worker() -> None:
    fleet = parse_fleet(
        {
            "models": {
                "alpha": {
                    "source": {"path": str(Path(__file__).parent)},
                    "profiles": {"cpu": {"max_wait_ms": 4, "latency_target_ms": 25}},
                }
            }
        }
    )
    host = ModelHost(
        fleet,
        InProcessQueue(),
        options=[RequestLimits()],
        device="cpu",
        loaders=encoder_loaders(FakeLoader()),
    )
    async with host:
        await asyncio.wait_for(host.wait_ready(), WAIT_S)
        assert LoadedEncoders(host.engines)["alpha"].limits.latency_target_s == pytest.approx(0.025)
        assert LoadedEncoders(host.engines)["alpha"].limits.max_wait_s == pytest.approx(0.004)
        worker = host.engines["encoder"].worker
        assert worker is not None
        assert worker.limits["alpha"].max_wait_s == 0.0  # a fresh controller: no wait yet
