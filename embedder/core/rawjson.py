"""Cheap looks at a raw JSON body, without parsing it: how deep it nests, and how many
tokens it holds when each text counts at most a model's window; and the one decode of a
body into a struct, its failures classified.

The gateway runs both on every body before anything decodes it (decoding skips what it
does not need, but still recurses through every level: a few kilobytes of ``[[[[`` took
msgspec past Python's recursion limit, a 500 on every route); the worker's decoder runs
the depth check again, so a job from any queue is held to the same limit.

Both work on bytes at C speed (``bytes.count``, one regular expression over the strings,
numpy over the brackets): a 4 MB body costs a few milliseconds.
"""

from __future__ import annotations

import math
import re
from typing import TypeVar

import msgspec
import numpy as np

from embedder.core.errors import InvalidRequest

_S = TypeVar("_S", bound=msgspec.Struct)

# No body of these APIs nests deeper than a handful of levels (a list of documents as
# objects, a search filter); the limit leaves room for metadata and stays far below the
# depth at which a recursive decoder runs out of stack.
MAX_DEPTH = 64

# A JSON string, escapes included (DOTALL: an escaped byte may be any byte; a body whose
# string breaks JSON's rules fails the decoder at that point, before any depth behind it).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.full(256, -1, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1


def depth(body: bytes) -> int:
    """How deep ``body``'s arrays and objects nest (brackets inside strings do not count);
    the exact depth of valid JSON, an estimate for broken JSON (which fails to decode)."""
    if not (b"[" in body or b"{" in body):
        return 0
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = _STEP[np.frombuffer(brackets, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max())


def check_depth(body: bytes, limit: int = MAX_DEPTH) -> None:
    """InvalidRequest (422) if ``body`` nests deeper than ``limit``."""
    if body.count(b"[") + body.count(b"{") <= limit:  # the common case: a count, no scan
        return
    found = depth(body)
    if found > limit:
        raise InvalidRequest(
            f"the request body nests {found} levels deep, more than the {limit} accepted: "
            "flatten it (inputs are strings or lists of them; metadata a few levels deep)"
        )


def estimate_tokens(body: bytes, bytes_per_token: float, max_tokens_per_text: int) -> int:
    """Tokens a body is expected to cost: its size over ``bytes_per_token``, with every
    string counted at most ``max_tokens_per_text`` (a model's window). A longer input is
    either cut to the window (truncation) or refused by the worker with a 413 that names
    the model's limit; it never costs more than the window, so admission must not count
    it at its full length."""
    whole = math.ceil(len(body) / bytes_per_token)
    if whole <= max_tokens_per_text:  # no string in it can be longer than the window
        return max(1, whole)
    cap = max_tokens_per_text * bytes_per_token
    size = float(len(body))
    for match in _STRING.finditer(body):
        length = match.end() - match.start()
        if length > cap:
            size -= length - cap
    return max(1, math.ceil(size / bytes_per_token))


def decode_struct(body: bytes, struct: type[_S]) -> _S:
    """``body`` as ``struct`` (unknown fields ignored, as the structs say). Bad JSON or a
    wrong type is an ``InvalidRequest`` (400) that says which."""
    try:
        return msgspec.json.decode(body, type=struct)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid request body: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from exc
    except RecursionError:  # check_depth runs first; this is the backstop
        raise InvalidRequest("the request body nests too deep to decode") from None
