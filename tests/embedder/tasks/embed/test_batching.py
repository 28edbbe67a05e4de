"""form_batch and flush_delay: properties over random pending sets, exhaustive small cases,
and a few named examples that read as the specification."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedder.core.jobs import ApiShape, Job
from embedder.tasks.embed.batching import (
    MIN_BUDGET_TOKENS,
    MIN_EFFICIENCY,
    TARGET_SHARE,
    BatchCost,
    BatchLimits,
    BatchPlan,
    DropReason,
    flush_delay,
    form_batch,
    late_jobs,
    take_budget,
    take_within,
)

NOW = 1_000.0
MODELS = ("alpha", "beta", "gamma")
EMBED = ApiShape.TEI_EMBED
RERANK = ApiShape.TEI_RERANK


def job(
    id: str,
    *,
    model: str = "alpha",
    tokens: int = 10,
    deadline: float = NOW + 30,
    enqueued_at: float = NOW,
    priority: int = 0,
    adapter: str | None = None,
    shape: ApiShape = EMBED,
) -> Job:
    return Job(
        id=id,
        model=model,
        shape=shape,
        body=b"{}",
        est_tokens=tokens,
        deadline=deadline,
        enqueued_at=enqueued_at,
        adapter=adapter,
        priority=priority,
    )


def limits_for(
    max_tokens: int = 100, max_requests: int = 8, max_wait_s: float = 1.0
) -> dict[str, BatchLimits]:
    return {model: BatchLimits(max_tokens, max_requests, max_wait_s) for model in MODELS}


def urgency_key(j: Job) -> tuple[float, int, float, str]:
    # The documented order: earliest deadline, then priority; arrival time and id only
    # break exact ties so that the choice is deterministic.
    return (j.deadline, j.priority, j.enqueued_at, j.id)


def ids(jobs: Sequence[Job]) -> list[str]:
    return [j.id for j in jobs]


# -- strategies -------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    pending: list[Job]
    limits: dict[str, BatchLimits]
    cancelled: frozenset[str]

    def is_dropped(self, j: Job) -> bool:
        return j.id in self.cancelled or j.deadline <= NOW

    @property
    def live(self) -> list[Job]:
        return [j for j in self.pending if not self.is_dropped(j)]


batch_limits = st.builds(
    BatchLimits,
    max_tokens=st.integers(1, 600),
    max_requests=st.integers(1, 8),
    max_wait_s=st.sampled_from([0.0, 0.5, 1.0, 2.5]),
)


def _jobs_from_rows(
    rows: list[tuple[str, str | None, ApiShape, int, int, int, int]],
) -> list[Job]:
    return [
        job(
            f"job-{i:03d}",
            model=model,
            adapter=adapter,
            shape=shape,
            tokens=tokens,
            # Half-second steps make ties in deadline and arrival common, and some
            # deadlines fall at or before NOW (expired).
            deadline=NOW + deadline_steps / 2,
            enqueued_at=NOW - waited_steps / 2,
            priority=priority,
        )
        for i, (model, adapter, shape, tokens, deadline_steps, waited_steps, priority) in (
            enumerate(rows)
        )
    ]


# One tuple per job, drawn as a list: much cheaper for hypothesis than a draw per field.
pending_jobs = st.lists(
    st.tuples(
        st.sampled_from(MODELS),
        st.sampled_from((None, "legal")),
        st.sampled_from(list(ApiShape)),
        st.integers(1, 300),
        st.integers(-4, 20),
        st.integers(0, 10),
        st.integers(0, 2),
    ),
    max_size=30,
).map(_jobs_from_rows)
limits_by_model = st.fixed_dictionaries({model: batch_limits for model in MODELS})


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    pending = draw(pending_jobs)
    limits = draw(limits_by_model)
    known = sorted(j.id for j in pending)
    # Ids of jobs already gone from the pending set may also be reported as cancelled.
    cancelled = draw(st.frozensets(st.sampled_from([*known, "gone-1", "gone-2"])))
    return Scenario(pending, limits, cancelled)


def plan_for(s: Scenario) -> BatchPlan:
    return form_batch(s.pending, s.limits, NOW, s.cancelled)


# -- form_batch: properties -------------------------------------------------

EXAMPLES = settings(max_examples=100, deadline=None)


@EXAMPLES
@given(scenarios())
def test_every_job_ends_up_in_exactly_one_place(s: Scenario) -> None:
    plan = plan_for(s)
    out = [*plan.batch, *plan.remaining, *(j for j, _ in plan.dropped)]
    assert Counter(out) == Counter(s.pending)


@EXAMPLES
@given(scenarios())
def test_cancelled_and_expired_jobs_are_dropped_with_their_reason(s: Scenario) -> None:
    plan = plan_for(s)
    expected = {
        j.id: DropReason.CANCELLED if j.id in s.cancelled else DropReason.EXPIRED
        for j in s.pending
        if s.is_dropped(j)
    }
    assert {j.id: reason for j, reason in plan.dropped} == expected
    assert not any(s.is_dropped(j) for j in (*plan.batch, *plan.remaining))


@EXAMPLES
@given(scenarios())
def test_batch_stays_within_the_model_limits(s: Scenario) -> None:
    plan = plan_for(s)
    if not plan.batch:
        return
    limit = s.limits[plan.batch[0].model]
    assert len(plan.batch) <= limit.max_requests
    assert plan.tokens == sum(j.est_tokens for j in plan.batch)
    # Only a lone job may exceed the budget: it must run some time, and alone is the least harm.
    assert plan.tokens <= limit.max_tokens or len(plan.batch) == 1


@EXAMPLES
@given(scenarios())
def test_batch_is_one_group_sorted_shortest_first(s: Scenario) -> None:
    plan = plan_for(s)
    assert len({j.group for j in plan.batch}) <= 1
    lengths = [j.est_tokens for j in plan.batch]
    assert lengths == sorted(lengths)


@EXAMPLES
@given(scenarios())
def test_batch_holds_the_most_urgent_live_job_and_its_group(s: Scenario) -> None:
    plan = plan_for(s)
    live = s.live
    if not live:
        assert plan.batch == ()
        assert plan.remaining == ()
        return
    first = min(live, key=urgency_key)
    assert first in plan.batch
    assert {j.group for j in plan.batch} == {first.group}


@EXAMPLES
@given(scenarios())
def test_batch_is_full_or_no_left_over_job_of_its_group_fits(s: Scenario) -> None:
    """Jobs that do not fit are skipped, so what is left of the group could not have joined."""
    plan = plan_for(s)
    if not plan.batch:
        return
    group = plan.batch[0].group
    limit = s.limits[plan.batch[0].model]
    if len(plan.batch) == limit.max_requests:
        return
    for j in plan.remaining:
        if j.group == group:
            assert plan.tokens + j.est_tokens > limit.max_tokens


@EXAMPLES
@given(scenarios())
def test_remaining_jobs_keep_their_original_order(s: Scenario) -> None:
    plan = plan_for(s)
    left = set(plan.remaining)
    assert list(plan.remaining) == [j for j in s.pending if j in left]


@EXAMPLES
@given(scenarios())
def test_plan_does_not_depend_on_the_order_of_pending(s: Scenario) -> None:
    plan = plan_for(s)
    shuffled = form_batch(list(reversed(s.pending)), s.limits, NOW, s.cancelled)
    assert shuffled.batch == plan.batch
    assert set(shuffled.remaining) == set(plan.remaining)
    assert set(shuffled.dropped) == set(plan.dropped)


@EXAMPLES
@given(scenarios())
def test_draining_a_fixed_pending_set_batches_every_live_job_once(s: Scenario) -> None:
    """No starvation: with no new arrivals, every live job is batched exactly once, the
    most urgent job left is in each batch, and batches go earliest deadline first."""
    pending: Sequence[Job] = s.pending
    batched: list[Job] = []
    leaders: list[Job] = []
    dropped: list[Job] = []
    for _ in range(len(s.pending) + 1):  # each round batches at least one job
        plan = form_batch(pending, s.limits, NOW, s.cancelled)
        dropped.extend(j for j, _ in plan.dropped)
        if not plan.batch:
            assert plan.remaining == ()
            break
        leader = min(plan.remaining + plan.batch, key=urgency_key)
        assert leader in plan.batch
        leaders.append(leader)
        batched.extend(plan.batch)
        pending = plan.remaining
    else:
        raise AssertionError("form_batch stopped making progress")
    assert Counter(batched) == Counter(s.live)
    assert Counter(dropped) == Counter(j for j in s.pending if s.is_dropped(j))
    assert leaders == sorted(leaders, key=urgency_key)


# -- form_batch: exhaustive small cases -------------------------------------


def test_budget_and_group_rules_hold_for_every_small_case() -> None:
    """Every combination of three jobs' sizes, models and urgency order against every
    small budget: the same invariants as above, with no sampling."""
    cases = 0
    for tokens in itertools.product(range(1, 4), repeat=3):
        for models in itertools.product(("alpha", "beta"), repeat=3):
            for order in itertools.permutations(range(3)):
                pending = [
                    job(f"j{i}", model=models[i], tokens=tokens[i], deadline=NOW + 1 + order[i])
                    for i in range(3)
                ]
                first = min(pending, key=urgency_key)
                for max_tokens in range(1, 7):
                    for max_requests in range(1, 4):
                        limits = limits_for(max_tokens, max_requests)
                        plan = form_batch(pending, limits, NOW)
                        _check_small_plan(plan, pending, first, limits)
                        cases += 1
    assert cases == 27 * 8 * 6 * 6 * 3


def _check_small_plan(
    plan: BatchPlan,
    pending: list[Job],
    first: Job,
    limits: Mapping[str, BatchLimits],
) -> None:
    limit = limits[first.model]
    assert plan.dropped == ()
    assert Counter([*plan.batch, *plan.remaining]) == Counter(pending)
    assert first in plan.batch
    assert all(j.model == first.model for j in plan.batch)
    assert len(plan.batch) <= limit.max_requests
    assert plan.tokens <= limit.max_tokens or plan.batch == (first,)
    if len(plan.batch) < limit.max_requests:
        for j in plan.remaining:
            if j.model == first.model:
                assert plan.tokens + j.est_tokens > limit.max_tokens


def test_drop_reason_for_every_combination_of_cancelled_and_expired() -> None:
    # Per job: live, cancelled, expired, or both; cancelled wins since the requester is gone.
    states = ("live", "cancelled", "expired", "both")
    for combo in itertools.product(states, repeat=4):
        pending = [
            job(f"j{i}", deadline=NOW if state in ("expired", "both") else NOW + 1 + i)
            for i, state in enumerate(combo)
        ]
        cancelled = {f"j{i}" for i, state in enumerate(combo) if state in ("cancelled", "both")}
        plan = form_batch(pending, limits_for(), NOW, cancelled)
        reasons = {j.id: reason for j, reason in plan.dropped}
        for i, state in enumerate(combo):
            expected = {
                "live": None,
                "cancelled": DropReason.CANCELLED,
                "both": DropReason.CANCELLED,
                "expired": DropReason.EXPIRED,
            }[state]
            assert reasons.get(f"j{i}") == expected
        live_ids = sorted(f"j{i}" for i, state in enumerate(combo) if state == "live")
        assert sorted(ids(plan.batch)) == live_ids  # all live ones fit in one batch


# -- form_batch: named examples ----------------------------------------------


def test_empty_pending_gives_an_empty_plan() -> None:
    assert form_batch([], limits_for(), NOW) == BatchPlan((), (), ())


def test_a_job_over_the_whole_budget_runs_alone() -> None:
    big = job("big", tokens=1_000, deadline=NOW + 1)
    small = job("small", tokens=10, deadline=NOW + 2)
    plan = form_batch([small, big], limits_for(max_tokens=100), NOW)
    assert plan.batch == (big,)
    assert plan.remaining == (small,)


def test_a_job_that_does_not_fit_is_skipped_for_a_later_one_that_does() -> None:
    a = job("a", tokens=60, deadline=NOW + 1)
    b = job("b", tokens=50, deadline=NOW + 2)
    c = job("c", tokens=30, deadline=NOW + 3)
    plan = form_batch([a, b, c], limits_for(max_tokens=100), NOW)
    assert plan.batch == (c, a)  # shortest first
    assert plan.remaining == (b,)
    assert plan.tokens == 90


def test_max_requests_takes_the_most_urgent_of_the_group() -> None:
    pending = [job(f"j{i}", deadline=NOW + 10 - i) for i in range(5)]
    plan = form_batch(pending, limits_for(max_tokens=10_000, max_requests=2), NOW)
    assert sorted(ids(plan.batch)) == ["j3", "j4"]


def test_priority_breaks_a_deadline_tie() -> None:
    low = job("low", model="alpha", priority=1)
    high = job("high", model="beta", priority=0)
    plan = form_batch([low, high], limits_for(), NOW)
    assert plan.batch == (high,)


def test_groups_split_by_adapter_and_task() -> None:
    base = job("base", deadline=NOW + 1)
    lora = job("lora", adapter="legal", deadline=NOW + 2)
    rerank = job("rerank", shape=RERANK, deadline=NOW + 3)
    same = job("same", deadline=NOW + 4)
    plan = form_batch([base, lora, rerank, same], limits_for(), NOW)
    assert sorted(ids(plan.batch)) == ["base", "same"]
    assert plan.remaining == (lora, rerank)


def test_a_deadline_equal_to_now_has_expired() -> None:
    plan = form_batch([job("edge", deadline=NOW)], limits_for(), NOW)
    assert plan.dropped == ((job("edge", deadline=NOW), DropReason.EXPIRED),)
    assert plan.batch == ()


# -- flush_delay --------------------------------------------------------------


def expected_delay(pending: Sequence[Job], limits: Mapping[str, BatchLimits]) -> float:
    """Zero once any group is full; otherwise until the first job has waited its model's
    max_wait or reaches its deadline, whichever is sooner."""
    if not pending:
        return math.inf
    tokens: Counter[object] = Counter()
    counts: Counter[object] = Counter()
    for j in pending:
        tokens[j.group] += j.est_tokens
        counts[j.group] += 1
    for j in pending:
        limit = limits[j.model]
        if tokens[j.group] >= limit.max_tokens or counts[j.group] >= limit.max_requests:
            return 0.0
    return min(
        max(0.0, min(j.enqueued_at + limits[j.model].max_wait_s, j.deadline) - NOW) for j in pending
    )


@EXAMPLES
@given(pending_jobs, limits_by_model)
def test_flush_delay_matches_its_definition(
    pending: list[Job], limits: dict[str, BatchLimits]
) -> None:
    delay = flush_delay(pending, limits, NOW)
    assert delay == expected_delay(pending, limits)
    assert delay >= 0.0


def test_flush_delay_is_infinite_with_nothing_pending() -> None:
    assert flush_delay([], limits_for(), NOW) == math.inf


def test_flush_delay_is_zero_when_a_group_is_full_by_tokens() -> None:
    pending = [job("a", tokens=60), job("b", tokens=40)]
    assert flush_delay(pending, limits_for(max_tokens=100), NOW) == 0.0
    assert flush_delay(pending, limits_for(max_tokens=101), NOW) == 1.0


def test_flush_delay_is_zero_when_a_group_is_full_by_requests() -> None:
    pending = [job(f"j{i}", tokens=1) for i in range(3)]
    assert flush_delay(pending, limits_for(max_requests=3), NOW) == 0.0
    assert flush_delay(pending, limits_for(max_requests=4), NOW) == 1.0


def test_flush_delay_counts_fullness_per_group_not_per_model() -> None:
    pending = [job("base", tokens=60), job("lora", tokens=60, adapter="legal")]
    assert flush_delay(pending, limits_for(max_tokens=100), NOW) == 1.0


def test_flush_delay_is_the_wait_left_for_the_oldest_job() -> None:
    pending = [job("new", enqueued_at=NOW), job("old", enqueued_at=NOW - 0.25)]
    assert flush_delay(pending, limits_for(max_wait_s=1.0), NOW) == 0.75


def test_flush_delay_is_zero_once_the_oldest_job_waited_max_wait() -> None:
    pending = [job("new", enqueued_at=NOW), job("old", enqueued_at=NOW - 1.0)]
    assert flush_delay(pending, limits_for(max_wait_s=1.0), NOW) == 0.0
    late = [job("older", enqueued_at=NOW - 5.0)]
    assert flush_delay(late, limits_for(max_wait_s=1.0), NOW) == 0.0


def test_flush_delay_wakes_for_a_deadline_sooner_than_max_wait() -> None:
    # A job about to expire must be dropped (and answered) promptly, not after max_wait.
    pending = [job("soon", deadline=NOW + 0.5)]
    assert flush_delay(pending, limits_for(max_wait_s=2.0), NOW) == 0.5
    expired = [job("gone", deadline=NOW - 1)]
    assert flush_delay(expired, limits_for(max_wait_s=2.0), NOW) == 0.0


def test_flush_delay_uses_each_models_own_max_wait() -> None:
    limits = {
        "alpha": BatchLimits(100, 8, max_wait_s=2.0),
        "beta": BatchLimits(100, 8, max_wait_s=0.5),
        "gamma": BatchLimits(100, 8, max_wait_s=1.0),
    }
    pending = [job("a", model="alpha"), job("b", model="beta")]
    assert flush_delay(pending, limits, NOW) == 0.5


# -- take_within: the one fill rule of every pull and of form_batch ----------------------


@given(st.lists(st.integers(1, 50), max_size=30), st.integers(1, 200), st.booleans())
@settings(max_examples=300, deadline=None)
def test_take_within_keeps_order_and_budget(sizes: list[int], budget: int, skip: bool) -> None:
    jobs = [job(f"j{i}", tokens=n) for i, n in enumerate(sizes)]
    taken = take_within(jobs, budget, skip_misfits=skip)
    assert taken == [j for j in jobs if j in taken]  # a subsequence, in the order given
    if jobs:
        assert taken[0] is jobs[0]  # the first always, even over the budget alone
    if len(taken) > 1:
        assert sum(j.est_tokens for j in taken) <= budget
    if not skip:  # stops at the first misfit: a prefix
        assert taken == jobs[: len(taken)]
    else:  # every job left out would have overflowed the budget at its turn
        total = 0
        for j in jobs:
            if j in taken:
                total += j.est_tokens
            else:
                assert total + j.est_tokens > budget


def test_take_within_caps_requests_and_leaves_the_rest_unread() -> None:
    jobs = [job(f"j{i}", tokens=1) for i in range(5)]
    read: list[str] = []

    def lazily() -> Iterator[Job]:
        for j in jobs:
            read.append(j.id)
            yield j

    assert ids(take_within(lazily(), 100, max_requests=2)) == ["j0", "j1"]
    assert read == ["j0", "j1"]  # decided on j2 without reading it: a queue's head stays
    read.clear()
    assert ids(take_within(lazily(), 2)) == ["j0", "j1"]
    assert read == ["j0", "j1", "j2"]  # j2 was looked at and left: it did not fit


# -- what a device can finish in time ------------------------------------------------------

COST = BatchCost(fixed_s=0.002, per_token_s=0.0001)  # 2 ms a pass, 10k tokens a second
TARGETED = BatchLimits(max_tokens=1000, max_requests=64, max_wait_s=0.0, latency_target_s=0.05)


def test_a_batch_cost_is_a_line_and_its_inverse() -> None:
    assert COST.seconds(100) == pytest.approx(0.012)
    assert COST.tokens_within(0.012) == pytest.approx(100)
    assert COST.tokens_within(0.001) < 0  # not even the fixed cost fits
    assert BatchCost(0.002, 0.0).tokens_within(0.01) == math.inf
    assert BatchCost(0.002, 0.0).tokens_within(0.001) == -math.inf


def test_the_budget_is_what_one_batch_runs_in_its_share_of_the_target() -> None:
    # Half of 50 ms is 25 ms: 2 ms fixed, then 230 tokens at 0.1 ms.
    assert TARGET_SHARE == 0.5
    assert take_budget(COST, TARGETED) == 230


def test_a_device_three_times_slower_takes_about_a_third() -> None:
    fast = BatchCost(0.0, 0.00002)
    slow = BatchCost(0.0, 0.00006)
    limits = replace(TARGETED, max_tokens=100_000)
    assert take_budget(fast, limits) == 1250
    assert take_budget(slow, limits) == 416


@pytest.mark.parametrize(
    ("cost", "limits", "factor", "budget"),
    [
        (None, TARGETED, 1.0, 1000),  # untimed: the profile's budget
        (None, TARGETED, 0.5, 1000),  # ... whatever the controller says
        (COST, replace(TARGETED, latency_target_s=None), 1.0, 1000),  # no target
        (BatchCost(0.0, 1e-9), TARGETED, 1.0, 1000),  # a fast device: capped by the profile
        (BatchCost(0.0, 0.1), TARGETED, 1.0, MIN_BUDGET_TOKENS),  # nothing fits: the floor
        (BatchCost(0.0, 1.0), replace(TARGETED, max_tokens=8), 1.0, 8),  # floor over the cap
        (BatchCost(0.0, 0.00005), TARGETED, 0.5, 250),  # the controller's share of the bound
        (BatchCost(0.0, 0.00005), TARGETED, 0.01, MIN_BUDGET_TOKENS),
        (COST, TARGETED, 0.5, 180),  # not below what runs at MIN_EFFICIENCY
        (BatchCost(1.0, 0.0), TARGETED, 1.0, 1000),  # tokens cost nothing: take them all
    ],
)
def test_the_budget_stays_between_its_floors_and_the_profile(
    cost: BatchCost | None, limits: BatchLimits, factor: float, budget: int
) -> None:
    assert take_budget(cost, limits, factor) == budget


def test_a_target_a_device_cannot_meet_under_load_does_not_starve_its_throughput() -> None:
    # A 2-core CPU's fit: 6.7 ms a pass, 0.16 ms a token. Half of a 20 ms target holds
    # 21 tokens, where the pass's fixed cost would be two thirds of the device's time;
    # the budget stops where it is a tenth.
    cpu = BatchCost(0.00669, 0.0001586)
    limits = replace(TARGETED, max_tokens=8192, latency_target_s=0.020)
    assert cpu.tokens_within(TARGET_SHARE * 0.020) == pytest.approx(20.9, abs=0.1)
    budget = take_budget(cpu, limits)
    assert budget == int(9 * 0.00669 / 0.0001586)
    assert cpu.per_token_s * budget / cpu.seconds(budget) == pytest.approx(MIN_EFFICIENCY, abs=1e-3)
    assert take_budget(cpu, limits, factor=0.5) == budget  # nor does the controller go lower


def first_delivery(*jobs: Job) -> list[Job]:
    return list(jobs)


def again(j: Job) -> Job:
    return replace(j, deliveries=2)


def reference_late(
    jobs: Sequence[Job],
    costs: Mapping[str, BatchCost],
    limits: Mapping[str, BatchLimits],
    free_at: float,
    by_start: bool,
) -> list[str]:
    """The documented rule, spelled out slowly: each job's finish is ``free_at`` plus the
    fewest batches of every job at least as urgent; its start, less its own batch."""
    ordered = sorted(jobs, key=urgency_key)
    late = []
    for i, j in enumerate(ordered):
        if j.model not in costs:
            continue
        device_s = 0.0
        for model, cost in costs.items():
            mine = [k for k in ordered[: i + 1] if k.model == model]
            tokens = sum(k.est_tokens for k in mine)
            limit = limits[model]
            batches = max(
                math.ceil(tokens / limit.max_tokens), math.ceil(len(mine) / limit.max_requests)
            )
            device_s += batches * cost.fixed_s + cost.per_token_s * tokens
            if model == j.model:
                own = max(tokens - (batches - 1) * limit.max_tokens, tokens / batches)
        when = free_at + device_s
        if by_start:
            when -= costs[j.model].fixed_s + costs[j.model].per_token_s * own
        if j.deliveries == 1 and when > j.deadline:
            late.append(j.id)
    return late


@st.composite
def timelines(
    draw: st.DrawFn,
) -> tuple[list[Job], dict[str, BatchCost], dict[str, BatchLimits], float]:
    rows = draw(
        st.lists(
            st.tuples(
                st.sampled_from(MODELS),
                st.integers(1, 300),
                st.integers(0, 40),  # deadline, in quarter seconds from NOW
                st.integers(0, 2),  # priority
                st.integers(1, 3),  # deliveries
            ),
            max_size=25,
        )
    )
    jobs = [
        replace(
            job(f"j{i:02d}", model=m, tokens=t, deadline=NOW + d / 4, priority=p),
            deliveries=n,
        )
        for i, (m, t, d, p, n) in enumerate(rows)
    ]
    costs = {
        m: BatchCost(draw(st.sampled_from([0.0, 0.01, 0.3])), draw(st.sampled_from([0.0, 1e-3])))
        for m in MODELS
        if draw(st.booleans())  # some models untimed
    }
    limits = {
        m: BatchLimits(draw(st.integers(1, 400)), draw(st.integers(1, 8)), 0.0) for m in MODELS
    }
    return jobs, costs, limits, NOW + draw(st.integers(0, 8)) / 4


@settings(max_examples=300, deadline=None)
@given(timelines(), st.booleans())
def test_late_jobs_follow_the_documented_timeline(
    timeline: tuple[list[Job], dict[str, BatchCost], dict[str, BatchLimits], float],
    by_start: bool,
) -> None:
    jobs, costs, limits, free_at = timeline
    late = late_jobs(jobs, costs, limits, free_at, by_start=by_start)
    assert ids(late) == reference_late(jobs, costs, limits, free_at, by_start)
    assert all(j.deliveries == 1 and j.model in costs for j in late)
    if by_start:  # what starts too late also finishes too late
        assert set(ids(late)) <= set(ids(late_jobs(jobs, costs, limits, free_at)))


def test_a_job_this_device_would_finish_after_its_deadline_is_late() -> None:
    costs = {"alpha": BatchCost(0.0, 0.01)}  # 10 ms a token
    limits = limits_for(max_tokens=100)
    tight = job("tight", tokens=10, deadline=NOW + 0.05)  # 100 ms here, 50 ms to go
    easy = job("easy", tokens=10, deadline=NOW + 30)
    assert late_jobs([tight, easy], costs, limits, NOW) == [tight]
    assert late_jobs([again(tight), easy], costs, limits, NOW) == []  # bounced once already
    assert late_jobs([tight, easy], {"beta": BatchCost(0.0, 1.0)}, limits, NOW) == []  # untimed
    # It would still start in time: a holder keeps it.
    assert late_jobs([tight, easy], costs, limits, NOW, by_start=True) == []


def test_the_device_busy_until_later_makes_more_jobs_late() -> None:
    costs = {"alpha": BatchCost(0.005, 0.0)}  # 5 ms a pass whatever its size
    limits = limits_for(max_tokens=100)
    jobs = [job(f"j{i}", tokens=50, deadline=NOW + 0.008 + i * 1e-6) for i in range(3)]
    # Batches of 100 tokens: j0 and j1 share the first (0-5 ms), j2 runs in the next.
    assert ids(late_jobs(jobs, costs, limits, NOW)) == ["j2"]
    assert ids(late_jobs(jobs, costs, limits, NOW + 0.004)) == ["j0", "j1", "j2"]
    # By start: the first batch still starts in time (4 ms), the second does not (9 ms).
    assert ids(late_jobs(jobs, costs, limits, NOW + 0.004, by_start=True)) == ["j2"]


def test_the_request_limit_counts_batches_too() -> None:
    costs = {"alpha": BatchCost(0.005, 0.0)}
    one_each = limits_for(max_tokens=1000, max_requests=1)
    jobs = [job(f"j{i}", tokens=1, deadline=NOW + 0.012 + i * 1e-6) for i in range(3)]
    assert ids(late_jobs(jobs, costs, one_each, NOW)) == ["j2"]  # 5, 10, 15 ms


def test_a_more_urgent_job_of_another_model_runs_first_and_counts() -> None:
    costs = {"alpha": BatchCost(0.0, 0.001), "beta": BatchCost(0.0, 0.001)}
    limits = limits_for(max_tokens=1000)
    urgent = job("urgent", model="beta", tokens=50, deadline=NOW + 0.06)
    mine = job("mine", model="alpha", tokens=20, deadline=NOW + 0.065)
    assert ids(late_jobs([mine, urgent], costs, limits, NOW)) == ["mine"]  # 50 + 20 ms
    assert late_jobs([mine], costs, limits, NOW) == []
