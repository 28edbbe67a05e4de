"""One NATS connection of a gateway or worker, and what that side needs on the server kept
there. The client reconnects for as long as it takes and replays its core subscriptions
(a gateway's reply inbox, a worker's withdrawals and dead-letter advisories) by itself;
what lives in JetStream it does not: a restarted server has lost every memory stream
(the liveness bucket always) and its consumers, a file stream survives with its durable
consumers. So each side names what it needs (``needs``), and ``Connection`` ensures it at
start, again after every reconnect, and whenever an operation finds it gone (``renew``),
with backoff until it holds. While the server is unreachable ``connected`` is False:
callers refuse at once instead of waiting on a request the client only buffers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError, NotFoundError, ServiceUnavailableError

from embedder.core.lifecycle import cancel_and_wait, watch
from embedder.queue.jetstream.security import NatsSecurity, open_connection

log = logging.getLogger(__name__)

RECONNECT_WAIT_S = 0.5  # between tries on a server: an outage is noticed and ended fast
FIRST_PAUSE_S = 0.1  # before ensuring again what failed to be ensured; doubles up to
MAX_PAUSE_S = 2.0
LOG_EVERY_S = 10.0  # one line per repeated failure this often, not one per try

# What JetStream answers when a stream or consumer is not there: the server lost it (a
# restart, memory storage) or is still restoring it (a restart, file storage).
MISSING: tuple[type[NatsError], ...] = (
    NotFoundError,  # an API request about it
    ServiceUnavailableError,  # a fetch from a consumer that is not there
    NoStreamResponseError,  # a publish no stream takes
    NoRespondersError,
)

UNREACHABLE = "the queue broker (NATS) is unreachable"


def missing(exc: BaseException) -> bool:
    """Whether a failed operation says that something the side needs is gone."""
    return isinstance(exc, MISSING)


class Sparse:
    """A logger's warning at most once every ``every_s``, saying how many like it were
    held back: an outage fails every beat and every pull, and one line now and then says
    so as well as thousands."""

    def __init__(self, logger: logging.Logger, every_s: float = LOG_EVERY_S) -> None:
        self.logger = logger
        self.every_s = every_s
        self._last = -float("inf")
        self._held = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._held += 1
            return
        held, self._held, self._last = self._held, 0, now
        suffix = f" ({held} more like it in the last {self.every_s:g} s)" if held else ""
        self.logger.warning(message + suffix, *args)


class Connection:
    """The client connection of one side (gateway submitter, fleet view, worker puller,
    worker heartbeat), and ``needs``: the coroutine that makes sure everything that side
    relies on exists on the server (idempotent; it may use ``nc`` and ``js``)."""

    def __init__(
        self,
        url: str,
        name: str,
        needs: Callable[[], Awaitable[None]],
        security: NatsSecurity | None = None,
    ) -> None:
        self.url = url
        self.name = name
        self._needs = needs
        self.security = security or NatsSecurity()
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._renewing: asyncio.Task[None] | None = None
        self._again = False
        self.reconnects = 0  # since open: a view older than the last one may be stale
        self._renew_failures = Sparse(log)
        self._client_errors = Sparse(log)

    @property
    def nc(self) -> Client:
        assert self._nc is not None, "the connection is not open"
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None, "the connection is not open"
        return self._js

    @property
    def opened(self) -> bool:
        return self._nc is not None

    @property
    def connected(self) -> bool:
        """Open and not reconnecting: a request now reaches the server."""
        return self._nc is not None and self._nc.is_connected

    async def open(self) -> None:
        """Connect, then ensure the needs, waiting for both as long as it takes (a stop
        cancels it): a server not up yet, or up before its JetStream is (a cluster still
        without its quorum), is waited for. A refusal of the link's security fails it."""
        if self._nc is not None:
            return
        # A server that refuses the link's security (TLS, credentials) fails this at once,
        # naming the setting, instead of being retried forever.
        self._nc = await open_connection(
            self.url,
            self.security,
            name=self.name,
            max_reconnect_attempts=-1,  # a request meanwhile is bounded by its deadline
            reconnect_time_wait=RECONNECT_WAIT_S,
            disconnected_cb=self._disconnected,
            reconnected_cb=self._reconnected,
            error_cb=self._error,
        )
        self._js = self._nc.jetstream()  # one context: the same client across reconnects
        try:
            await self._ensure_until_held()
        except BaseException:
            nc, self._nc = self._nc, None
            await nc.close()
            raise

    async def close(self) -> None:
        nc, self._nc = self._nc, None
        await cancel_and_wait(self._renewing)
        if nc is not None:
            await nc.close()

    def renew(self) -> None:
        """Ensure the needs again, in the background (an operation found one gone, or the
        client reconnected): one run at a time, a call during a run makes it run again."""
        if self._nc is None:
            return
        if self._renewing is not None and not self._renewing.done():
            self._again = True
            return
        self._renewing = watch(asyncio.create_task(self._renew(), name=f"renew {self.name}"))

    async def _ensure_until_held(self) -> None:
        """The needs, tried again shortly while they fail: the server may be up before
        its JetStream is, or the client between servers."""
        pause = FIRST_PAUSE_S
        while True:
            try:
                return await self._needs()
            except (NatsError, TimeoutError) as exc:
                self._renew_failures.warning(
                    "%s: ensuring its streams, consumers and bucket failed: %r", self.name, exc
                )
            await asyncio.sleep(pause)
            pause = min(2 * pause, MAX_PAUSE_S)

    async def _renew(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            await self._ensure_until_held()
            log.info("%s: streams, consumers and bucket re-established", self.name)

    async def _disconnected(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            log.warning("%s: %s (%s); reconnecting", self.name, UNREACHABLE, self.url)

    async def _reconnected(self) -> None:
        self.reconnects += 1
        log.warning("%s: reconnected to %s", self.name, self.url)
        # Not awaited here: this runs inside the client's reconnect, before it is done.
        self.renew()

    async def _error(self, exc: Exception) -> None:
        # The client reports every failed reconnect try; during an outage that is two a
        # second, said once in a while.
        self._client_errors.warning("%s: %r", self.name, exc)
