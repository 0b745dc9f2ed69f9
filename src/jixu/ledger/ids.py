"""Globally unique, time-ordered identifiers (ULIDs).

A ULID is 48 bits of milliseconds since the Unix epoch followed by 80 random
bits, written as 26 Crockford base-32 characters. Ids made in one process are
strictly increasing even within one millisecond (the random part is
incremented), so sorting ids sorts by creation time.
"""

from __future__ import annotations

import os
import re
import threading
import time

from jixu.errors import InvalidId

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ULID_PATTERN = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$")

_lock = threading.Lock()
_last_ms = -1
_last_random = 0
_time_text = ""  # the encoded _last_ms: ids made within one millisecond share it
_random_text = ""  # the encoded _last_random


_PAIRS = [first + second for first in _ALPHABET for second in _ALPHABET]
"""Every two-character group, by its 10-bit value: half the steps of one character at a time."""


def _encode(value: int, length: int) -> str:
    """The low ``length * 5`` bits of ``value`` in Crockford base-32, most significant first (``length`` even)."""
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in range((length - 2) * 5, -1, -10)])


def new_id() -> str:
    """Return a new ULID, strictly greater than any made before in this process."""
    global _last_ms, _last_random, _time_text, _random_text
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            _last_random += 1
            low = _last_random & 1023
            if low:
                # Only the last two characters change (no carry out of the low 10 bits): ids made within one
                # millisecond (a busy process makes several) skip encoding the other fourteen (~40 % of a call).
                _random_text = _random_text[:14] + _PAIRS[low]
                return _time_text + _random_text
            now_ms = _last_ms
            if _last_random >= 1 << 80:  # pragma: no cover - 2**80 ids in one ms
                now_ms += 1
                _last_random = int.from_bytes(os.urandom(10), "big") >> 1
        else:
            # Leave headroom so increments within the millisecond never overflow.
            _last_random = int.from_bytes(os.urandom(10), "big") >> 1
        if now_ms != _last_ms:
            _last_ms, _time_text = now_ms, _encode(now_ms, 10)
        _random_text = _encode(_last_random, 16)
        return _time_text + _random_text


def is_valid_id(value: object) -> bool:
    """True when ``value`` is a well-formed ULID string."""
    return isinstance(value, str) and ULID_PATTERN.match(value) is not None


def check_id(value: object, what: str = "id") -> str:
    """Return ``value`` if it is a well-formed ULID, else raise :class:`InvalidId`."""
    if not is_valid_id(value):
        raise InvalidId(
            f"{what} {value!r} is not a valid id (26 Crockford base-32 characters, "
            "as made by jixu.new_id())",
            field=what,
        )
    assert isinstance(value, str)
    return value


__all__ = ["ULID_PATTERN", "check_id", "is_valid_id", "new_id"]
