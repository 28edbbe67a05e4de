"""Classified errors of the vector stores, on the same base as the serving errors.

Both engines raise only these (``classified`` sorts their clients' exceptions into
them), so the pipeline retries only what says ``retriable`` (with backoff and a
deadline) and dead-letters or fails on the rest; the gateway maps ``http_status`` if
one surfaces there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from embedder.core.errors import FlotillaError


class StoreError(FlotillaError):
    """A vector store failure that a retry will not fix (the cause is chained)."""

    http_status = 500
    code = "store_error"


class StoreUnavailable(StoreError):
    """The store is unreachable, overloaded or timed out: back off and retry."""

    http_status = 503
    retriable = True
    code = "store_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})
        self.retry_after_s = retry_after_s


class StoreMisconfigured(StoreError):
    """The store's server answers, but not as this client is configured to speak to it:
    the URL's scheme, the CA that verifies it, the client certificate. Raised at start;
    a retry will not fix it, so the message names the setting to change."""

    code = "store_misconfigured"


def records_fault(exc: StoreError) -> bool:
    """Whether a store's refusal is the records' own (a payload it cannot hold, a name it
    refuses, the collection's model guard): those are dead-lettered. An outage is retried
    and a misconfigured client (a refused API key) fails the chunk uncommitted, so neither
    ever costs a document."""
    return not (exc.retriable or isinstance(exc, StoreMisconfigured))


class ShardLocked(StoreError):
    """An embedded collection is owned by another process (or another store in this one).

    Not retriable: the owner keeps it for as long as it runs. The store itself waits a
    moment for a predecessor that is still exiting (``EdgeStore``'s ``lock_wait_s``);
    past that the message names the ways in that work while the owner runs.
    """

    http_status = 409
    code = "shard_locked"


class CollectionNotFound(StoreError):
    http_status = 404
    code = "collection_not_found"


class CollectionModelMismatch(StoreError):
    """The collection holds vectors of another model, dimension or distance.

    Mixing them would silently ruin every search, so the store refuses; the fix is to
    re-embed into a new collection.
    """

    http_status = 409
    code = "collection_model_mismatch"


class InvalidStoreRequest(StoreError):
    """Bad input: wrong vector length, non-finite values, a bad id, filter or name."""

    http_status = 422
    code = "invalid_store_request"


W = TypeVar("W")  # what the engine says the failure concerns (a collection name, or None)


@contextlib.contextmanager
def classified(classify: Callable[[Exception, W], StoreError], where: W) -> Iterator[None]:
    """Re-raise what an engine raises as the store error ``classify(exc, where)`` sorts it
    into, the cause chained; a ``StoreError`` (one of the store's own checks) passes as is."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:
        raise classify(exc, where) from exc
