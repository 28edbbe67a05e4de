"""The one place a caller's key is checked against the accepted ones (``--api-keys``, and
the admin API's ``--admin-keys``).

Compared in constant time: an ordinary ``==`` stops at the first differing byte, so how
long a refusal takes would tell an attacker how much of a key they have guessed. Each
side is hashed first, so that the comparison also takes as long whatever the length of
the key, and every key is compared (no early exit), so the time says nothing of which
key matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable


def known_key(token: str, keys: Iterable[str]) -> bool:
    """Whether ``token`` is one of ``keys``; an empty token never is."""
    given = _digest(token)
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, _digest(key))
    return found and bool(token)


def bearer_token(authorization: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; empty for any other."""
    scheme, _, token = authorization.partition(" ")
    return token if scheme.lower() == "bearer" else ""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
