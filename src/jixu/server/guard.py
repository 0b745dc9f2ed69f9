"""Authentication at the door of every request: failed attempts rate-limited, successful ones noted (cheaply).

A failed authentication with a bearer token of the right form (an unknown
id, a wrong secret, a revoked or expired token) takes one unit from two
token buckets held in this server process: one per client address and one
per token id the attempt named. While either bucket is empty, attempts from
that address or naming that token id are refused with 429
``too_many_failed_logins`` and a ``Retry-After`` header, before any secret
is checked or the store is read, so guessing gains nothing by going faster.
A request with no credential, or one not even of the form
``jixu_<id>_<secret>``, is a plain 401: it guesses nothing and reads
nothing. A caller that authenticated from its address with its token in the
last hour answers only for the failures of that pair (its own bucket), not
for the others' at its address or naming its token id, so callers already
at work never wait for an attacker next to them; a success costs a
dictionary look-up. (An attacker at the same address naming the same token
id cannot be told from its holder: both are limited by the pair's bucket.)

A success also notes when the token was used: written to the store (its
credential-use rows) at most once per :attr:`AuthGuard.use_interval` per
token and process, never once per request.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field

from jixu.errors import JixuError
from jixu.ledger import Store
from jixu.server.auth import USE_KEY_PREFIX, Principal, authenticate, token_id_of
from jixu.server.problems import RATE_LIMITED, HTTPProblem

log = logging.getLogger("jixu.server")
MAX_KEYS = 100_000
"""Buckets (and remembered successes) kept per kind at most; past it, the full ones are forgotten first."""
TRUSTED_SECONDS = 3600.0


@dataclass(frozen=True)
class FailureLimit:
    """A token bucket's shape: ``burst`` failures at once, then ``per_minute`` more each minute."""

    burst: int = 20
    per_minute: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ValueError(f"burst {self.burst!r} must be an integer >= 1")
        if not self.per_minute > 0:
            raise ValueError(f"per_minute {self.per_minute!r} must be > 0")


@dataclass
class Buckets:
    """Token buckets by key, all of one :class:`FailureLimit` (not thread-safe: :class:`AuthGuard` locks)."""

    limit: FailureLimit
    levels: dict[str, tuple[float, float]] = field(default_factory=dict)
    """key -> (units left, monotonic time of that level)."""

    def _level(self, key: str, now: float) -> float:
        units, at = self.levels.get(key, (float(self.limit.burst), now))
        return min(float(self.limit.burst), units + (now - at) * self.limit.per_minute / 60.0)

    def wait(self, key: str, now: float) -> float:
        """Seconds until ``key`` may try again (0: it may now)."""
        missing = 1.0 - self._level(key, now)
        return 0.0 if missing <= 0 else missing * 60.0 / self.limit.per_minute

    def take(self, key: str, now: float) -> None:
        """One failure of ``key``."""
        if len(self.levels) >= MAX_KEYS:
            self.levels = {k: v for k, v in self.levels.items() if self._level(k, now) < self.limit.burst}
            if len(self.levels) >= MAX_KEYS:  # every bucket is draining: an attack from everywhere; start over
                self.levels.clear()
        self.levels[key] = (max(0.0, self._level(key, now) - 1.0), now)


class AuthGuard:
    """Authenticates requests for one server process (see the module docstring)."""

    def __init__(self, store: Store, *, per_address: FailureLimit | None = None,
                 per_token: FailureLimit | None = None, use_interval: float = 60.0) -> None:
        self.store = store
        self.addresses = Buckets(per_address or FailureLimit())
        self.tokens = Buckets(per_token or FailureLimit())
        self.pairs = Buckets(per_token or FailureLimit())
        self.use_interval = use_interval
        self._trusted: dict[tuple[str, str], float] = {}
        self._noted: dict[str, float] = {}
        self._lock = threading.Lock()

    def _trusted_pair(self, address: str, token_id: str, now: float) -> str | None:
        """The pair's bucket key when ``token_id`` authenticated from ``address`` lately, else ``None``."""
        at = self._trusted.get((address, token_id))
        return f"{address} {token_id}" if at is not None and now - at < TRUSTED_SECONDS else None

    def check(self, address: str, token_id: str) -> None:
        """Refuse (429) an attempt from ``address`` naming ``token_id`` while it has failed too often.

        A pair that authenticated lately answers only for its own failures (its own bucket); any other
        attempt for the address's and the token id's.
        """
        now = time.monotonic()
        with self._lock:
            pair = self._trusted_pair(address, token_id, now)
            if pair is not None:
                wait = self.pairs.wait(pair, now)
            else:
                wait = max(self.addresses.wait(address, now), self.tokens.wait(token_id, now))
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise HTTPProblem(RATE_LIMITED, f"too many failed authentications from this address or for this token; "
                                            f"try again in {seconds} s", headers={"Retry-After": str(seconds)},
                              retry_after=seconds)

    def failed(self, address: str, token_id: str) -> None:
        """Count one failed attempt against ``address`` and ``token_id`` (and their pair, if it is trusted)."""
        now = time.monotonic()
        with self._lock:
            self.addresses.take(address, now)
            self.tokens.take(token_id, now)
            pair = self._trusted_pair(address, token_id, now)
            if pair is not None:
                self.pairs.take(pair, now)

    def succeeded(self, address: str, token_id: str) -> None:
        """Remember the pair (its later attempts are not held back) and note the token's use (throttled)."""
        now = time.monotonic()
        with self._lock:
            if len(self._trusted) >= MAX_KEYS:
                self._trusted = {k: t for k, t in self._trusted.items() if now - t < TRUSTED_SECONDS}
                if len(self._trusted) >= MAX_KEYS:
                    self._trusted.clear()
            self._trusted[(address, token_id)] = now
            due = now - self._noted.get(token_id, -math.inf) >= self.use_interval
            if due:
                if len(self._noted) >= MAX_KEYS:
                    self._noted.clear()
                self._noted[token_id] = now
        if due:
            self.note_use(token_id)

    def note_use(self, token_id: str) -> None:
        """Write the token's last use to the store (a failure is logged: it must not fail the request)."""
        try:
            self.store.record_use(f"{USE_KEY_PREFIX}{token_id}")
        except JixuError as error:
            log.warning("could not note the use of token %s: %s", token_id, error.message)

    def authenticate(self, address: str, authorization: str | None) -> Principal:
        """The caller of a request from ``address`` with this ``Authorization`` header: 429 while rate-limited,
        401 when the credential is bad (counted), else the principal (its use noted)."""
        token_id = token_id_of(authorization)
        if token_id is None:  # no credential, or not even the form of one: nothing to guess, no store read
            return authenticate(self.store, authorization)
        self.check(address, token_id)
        try:
            found = authenticate(self.store, authorization)
        except HTTPProblem as refused:
            if refused.status == 401:
                self.failed(address, token_id)
            raise
        self.succeeded(address, found.token_id)
        return found


__all__ = ["AuthGuard", "Buckets", "FailureLimit"]
