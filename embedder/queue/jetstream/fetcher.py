"""How a worker reads the JetStream work queue (``puller`` holds and answers what it
reads): one pull subscription per lane of each model (``JetStreamConfig.lanes``: one
lane per model unless deadline lanes are set), bound to the durable consumer all that
model's workers share, and the fetches that bring no more than a pull can take.

A worker with several lanes to read fetches from one: the most urgent lane with
requests waiting, and among those the one with the most (the server's count, read from
each fetched message's ``num_pending`` or, when that is older than ``DEPTH_FRESH_S``,
from the consumer's info, every stale lane in one concurrent round trip), the earliest
deadline among equals. A batch not filled by its lane is topped up from the same model's
next lanes. Only when none has any waiting does a pull wait on all of them at once, one
short fetch each. A fetch such a wait leaves open on the server may still bring a
request after the pull has returned: that one goes back at once (``nak`` without
delay), so a busy worker holds nothing it is not running while other workers ask for
work."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo
from prometheus_client import Counter as MetricCounter

from embedder.queue.jetstream.config import JetStreamConfig, Lane
from embedder.queue.jetstream.connection import Connection, Sparse, missing
from embedder.queue.jetstream.streams import ensure_consumer

log = logging.getLogger(__name__)

HANDLED = MetricCounter(
    "flotilla_jetstream_requests",
    "Request messages a worker fetched, by what became of them: 'taken', 'handed_back' "
    "(nak after --nats-nak-delay-ms: over the token budget), 'handed_back_late' (nak, no "
    "delay: the worker cannot finish it before its deadline, a faster one may), "
    "'handed_on' (nak, no delay: a fetch left open by an idle wait brought it while the "
    "worker ran a batch), 'withdrawn' (acked unanswered: the gateway's client left), "
    "'expired' and 'malformed' (both terminated).",
    ["outcome"],
)
HANDED_ON = HANDLED.labels("handed_on")
# How long a fetch for the rest of a batch may linger on the server: the requests that
# arrive within it go with the batch, the later ones to whichever worker asks first.
REST_WAIT_S = 0.002
# A first request that came within this was already waiting: there may be more, worth
# the fetch for the rest; one that took longer arrived while the worker waited.
BACKLOG_S = 0.005
# How long a fetch for requests the server counts as waiting may take: it ends as soon
# as they come, so this bounds only a busy machine's delivery, or a race with another
# worker for them (after which the pull waits on every model).
PENDING_WAIT_S = 0.05
# How long a lane's depth as last seen stands for the present. Under load a worker
# pulls every few milliseconds: the fetched lane's depth comes free with its messages,
# the others' cost one round trip (together) when older than this.
DEPTH_FRESH_S = 0.03
# The longest one fetch of an idle wait stays open on the server (a longer pull opens
# another). What it brings after the pull returned is handed on, each time a delivery
# toward ``max_deliver``: a short life keeps that rare.
IDLE_FETCH_S = 0.25

Subscription = JetStreamContext.PullSubscription


@dataclass(frozen=True, slots=True)
class Depth:
    """One lane's queue as this worker last saw it: the requests waiting (not yet
    delivered to any worker; a handed-back one is not counted), when (monotonic
    seconds), the deadline of the last one fetched (the nearest sign of how urgent the
    queue's head is), and when this worker last took requests of it."""

    waiting: int
    seen_at: float
    head_deadline: float = math.inf
    served_at: float = -math.inf


def deepest(depths: Mapping[Lane, Depth], now: float) -> Lane | None:
    """The lane to fetch from: the most urgent lane with requests waiting; among those,
    the most waiting work, counted as requests waiting times how long since this worker
    last served the lane, so that a shallow queue's turn comes too (by depth alone a
    worker would starve it while another stays deeper); then the most requests, then the
    earliest head deadline. None when no lane has any."""
    ranked = [
        (-lane.index, d.waiting * (now - d.served_at), d.waiting, -d.head_deadline, lane)
        for lane, d in depths.items()
        if d.waiting > 0
    ]
    return max(ranked)[-1] if ranked else None


class Fetcher:
    """The fetching half of a ``JetStreamPuller``, over its connection: a fetch that finds
    a consumer gone has the connection make it again (``ensure_consumers``)."""

    def __init__(self, link: Connection, config: JetStreamConfig) -> None:
        self._link = link
        self.config = config
        self._failures = Sparse(log)
        self._subs: dict[Lane, Subscription] = {}
        self._depths: dict[Lane, Depth] = {}
        # An idle wait's fetches, per lane; each ends by its own timeout.
        self._fetching: dict[Lane, asyncio.Future[list[Msg]]] = {}
        self._pulling = False  # what an open fetch brings now is this pull's
        self._closing = False  # what an open fetch brings now is handed back by close()
        # Brought between pulls on their last delivery (handing them on would
        # dead-letter them): the next pull takes them.
        self._kept: list[Msg] = []
        self._handing: set[asyncio.Future[None]] = set()
        self._counted: set[Lane] = set()  # lanes whose consumer ``waiting`` has made

    async def fetch(self, models: Collection[str], batch: int, timeout_s: float) -> list[Msg]:
        """Up to ``batch`` messages: what an earlier wait's fetches brought; else the
        most urgent, deepest lane's waiting requests; else the first of any lane's to
        come within ``timeout_s``."""
        started = time.monotonic()
        subs = {lane: await self._subscription(lane) for lane in self._lanes(models)}
        found: list[Msg] = []
        self._pulling = True
        try:
            found = self._collect()  # with requests in hand already, take them and go
            if not found and len(subs) > 1:
                found = await self._fetch_deepest(subs, batch)
            if not found:
                remaining = timeout_s - (time.monotonic() - started)
                found = await self._wait_on_all(subs, batch, max(remaining, 0.001))
            found += self._collect()
        finally:
            self._pulling = False
            self._hand_on(self._collect())  # only after a failure: found none of it
        return found

    def saw_deadline(self, lane: Lane, deadline: float) -> None:
        """The deadline of a request just fetched from ``lane``: near its queue's head."""
        if (depth := self._depths.get(lane)) is not None:
            self._depths[lane] = replace(depth, head_deadline=deadline)

    async def close(self) -> None:
        """Wait for the fetches still open (each ends by its own short timeout) and hand
        back what they brought, so that nothing waits out ``ack_wait`` on a stopped
        worker."""
        self._closing = True
        if self._fetching:
            await asyncio.wait(self._fetching.values())
        await self._nak_all(self._collect())
        if self._handing:
            await asyncio.gather(*self._handing)

    async def ensure_consumers(self) -> None:
        """The consumers of the lanes fetched so far, made again where the server lost
        them; their subscriptions go on as they are (a fetch names the consumer)."""
        for lane in list(self._subs):
            await ensure_consumer(self._link.js, self.config, lane)

    async def _subscription(self, lane: Lane) -> Subscription:
        sub = self._subs.get(lane)
        if sub is None:
            js = self._link.js
            durable = await ensure_consumer(js, self.config, lane)
            sub = await js.pull_subscribe_bind(durable=durable, stream=self.config.stream)
            self._subs[lane] = sub
        return sub

    async def waiting(self, models: Collection[str]) -> dict[str, int]:
        """The requests of each model not yet answered, by the server's count over its
        lanes: waiting, in some worker's hand, or handed back (a request a worker caught
        for a model it had just evicted goes back to wait for redelivery, which
        ``num_pending`` does not count). For models fetched or not: their consumers are
        made here, so that the count exists before any worker hosts the model. A lane the
        server does not answer for is not counted; a model with no lane counted is left
        out."""
        lanes = self._lanes(models)
        for lane in lanes:
            if lane not in self._counted and lane not in self._subs:
                await ensure_consumer(self._link.js, self.config, lane)
                self._counted.add(lane)
        counts: dict[str, int] = {}
        for lane, info in await self._consumer_infos(lanes):
            if isinstance(info, BaseException):
                if missing(info):
                    self._counted.discard(lane)  # made again at the next look
                continue
            count = (info.num_pending or 0) + (info.num_ack_pending or 0)
            counts[lane.model] = counts.get(lane.model, 0) + count
        return counts

    # -- choosing by urgency and depth -------------------------------------------------

    async def _fetch_deepest(self, subs: dict[Lane, Subscription], batch: int) -> list[Msg]:
        """One fetch, from the most urgent lane with requests waiting (the deepest among
        equals), so that no fetch is left open behind the pull, topped up from the same
        model's next lanes while the batch has room; none when no lane has any (or a
        wait's fetch is still open on the chosen one: the wait collects it)."""
        now = time.monotonic()
        await self._refresh_depths([lane for lane in subs if self._stale(lane, now)])
        lane = deepest({q: self._depths[q] for q in subs if q in self._depths}, now)
        if lane is None or lane in self._fetching:
            return []
        found = await self._fetch_one(lane, subs[lane], batch, PENDING_WAIT_S)
        for later in self.config.lanes(lane.model)[lane.index + 1 :]:
            if len(found) >= batch or not found:
                break
            depth = self._depths.get(later)  # subs holds every lane of a hosted model
            if later not in self._fetching and depth and depth.waiting:
                found += await self._fetch_one(
                    later, subs[later], batch - len(found), PENDING_WAIT_S
                )
        return found

    def _stale(self, lane: Lane, now: float) -> bool:
        """Whether the lane's depth must be asked: unknown, old, or none waiting at the
        last look (that changes without a fetch to tell). A lane with a wait's fetch
        open needs no asking: that fetch takes the first request to come."""
        if lane in self._fetching:
            return False
        depth = self._depths.get(lane)
        return depth is None or depth.waiting == 0 or now - depth.seen_at > DEPTH_FRESH_S

    async def _refresh_depths(self, lanes: list[Lane]) -> None:
        """The consumers' counts of waiting requests, asked together (one round trip)."""
        if not lanes:
            return
        infos = await self._consumer_infos(lanes)
        now = time.monotonic()
        for lane, info in infos:
            if isinstance(info, BaseException):  # unknown: the wait on all reaches it
                log.debug("the depth of %s is unknown: %r", lane, info)
                self._depths.pop(lane, None)
                if missing(info):
                    self._link.renew()
            else:
                self._see(lane, info.num_pending or 0, now)

    async def _consumer_infos(
        self, lanes: list[Lane]
    ) -> list[tuple[Lane, ConsumerInfo | BaseException]]:
        """Each lane's consumer info, or the error asking for it raised; asked together."""
        infos = await asyncio.gather(
            *(
                self._link.js.consumer_info(
                    self.config.stream, self.config.lane_consumer(lane), timeout=IDLE_FETCH_S
                )
                for lane in lanes
            ),
            return_exceptions=True,
        )
        return list(zip(lanes, infos, strict=True))

    def _lanes(self, models: Collection[str]) -> list[Lane]:
        return [lane for model in models for lane in self.config.lanes(model)]

    def _see(self, lane: Lane, waiting: int, now: float, *, served: bool = False) -> None:
        old = self._depths.get(lane) or Depth(waiting, now)
        self._depths[lane] = replace(
            old, waiting=waiting, seen_at=now, served_at=now if served else old.served_at
        )

    # -- waiting on every lane ---------------------------------------------------------

    async def _wait_on_all(
        self, subs: dict[Lane, Subscription], batch: int, timeout_s: float
    ) -> list[Msg]:
        """Every lane at once, none waiting at the last look: the first fetch to bring
        something ends the wait. The others are left open, never cancelled (a cancelled
        fetch would leave what the server sends it in the subscription's inbox, unseen);
        each ends by its own short timeout, and what it brings after this pull returned
        is handed on (``_ended_unasked``)."""
        if len(subs) == 1 and not self._fetching:
            [(lane, sub)] = subs.items()
            return await self._fetch_one(lane, sub, batch, timeout_s)
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            each_s = min(remaining, IDLE_FETCH_S)
            for lane, sub in subs.items():
                if lane not in self._fetching:
                    task = asyncio.ensure_future(self._fetch_one(lane, sub, batch, each_s))
                    task.add_done_callback(functools.partial(self._ended_unasked, lane))
                    self._fetching[lane] = task
            await asyncio.wait(
                self._fetching.values(), timeout=each_s + 1.0, return_when=asyncio.FIRST_COMPLETED
            )
            if found := self._collect():
                return found
        return []

    def _ended_unasked(self, lane: Lane, task: asyncio.Future[list[Msg]]) -> None:
        """A wait's fetch brought requests while this worker is not pulling (it runs a
        batch): they go back at once, to a worker that is asking."""
        if self._pulling or self._closing or self._fetching.get(lane) is not task:
            return  # the pull, or close(), collects it
        del self._fetching[lane]
        if not task.cancelled():
            self._hand_on(task.result())

    def _hand_on(self, messages: list[Msg]) -> None:
        """Back to the queue without delay; but one on its last delivery would be
        dead-lettered by it, so that one waits for this worker's next pull."""
        if not messages:
            return
        last = self.config.max_deliver
        back = [m for m in messages if m.metadata.num_delivered < last]
        self._kept.extend(m for m in messages if m.metadata.num_delivered >= last)
        if back:
            HANDED_ON.inc(len(back))
            handing = asyncio.ensure_future(self._nak_all(back))
            self._handing.add(handing)
            handing.add_done_callback(self._handing.discard)

    def _collect(self) -> list[Msg]:
        """The messages kept for a pull and those of the wait's fetches that ended."""
        found, self._kept = self._kept, []
        for lane, task in list(self._fetching.items()):
            if task.done():
                del self._fetching[lane]
                if not task.cancelled():
                    found.extend(task.result())
        return found

    @staticmethod
    async def _nak_all(messages: list[Msg]) -> None:
        for msg in messages:
            with contextlib.suppress(NatsError):
                await msg.nak()

    # -- one lane ----------------------------------------------------------------------

    async def _fetch_one(
        self, lane: Lane, sub: Subscription, batch: int, timeout_s: float
    ) -> list[Msg]:
        """The first message as soon as there is one, then up to the rest of ``batch``:
        those the server counts as waiting behind it, or, when none is counted but the
        first came at once, those that arrive within ``REST_WAIT_S``; no rest for a wait's
        fetch that ends after its pull returned. A pull request outlives its fetch on the
        server until it is filled or expires: asked for a whole batch at once, a worker
        would go on collecting requests into its inbox while it runs the first ones,
        where no free worker can take them."""
        try:
            asked = time.monotonic()
            first = await sub.fetch(1, timeout=max(timeout_s, 0.001))
            waiting = first[-1].metadata.num_pending or 0
            self._see(lane, waiting, time.monotonic(), served=True)
            if batch <= len(first) or not self._pulling:
                return first
            if waiting > 0:  # counted by the server, so asked for whatever the wait took
                rest, wait_s = min(batch - len(first), waiting), PENDING_WAIT_S
            elif time.monotonic() - asked <= BACKLOG_S:  # maybe a burst still arriving
                rest, wait_s = batch - len(first), REST_WAIT_S
            else:
                return first  # it had to wait for one: nothing else is waiting
            try:
                more = await sub.fetch(rest, timeout=wait_s)
            except TimeoutError:
                return first
            self._see(lane, more[-1].metadata.num_pending or 0, time.monotonic())
            return first + more
        except TimeoutError:
            self._see(lane, 0, time.monotonic())
            return []
        except NatsError as exc:
            if missing(exc):
                self._link.renew()  # the server lost the consumer: made again meanwhile
            self._failures.warning("fetching requests of %s failed: %r", lane, exc)
            await asyncio.sleep(timeout_s)
            return []
