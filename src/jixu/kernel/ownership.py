"""Claims and heartbeats: the one fence mechanism of threads' turns, runs and the workers that execute them.

A claim takes a stream's lease (``thread/<id>/turn``, ``run/<id>/owner``) for
one owner at a new epoch and records the ``*.claimed`` event fenced by it; the
owner then renews the lease every ``ttl / 3`` seconds against the store's clock
for as long as it works (:class:`Session`), and every event it appends is
fenced by the claim. A claim classifies what it took over:

==========================  ======================================================
``claimed``                 no lease existed
``continued``               the previous holder released it
``reclaimed_by_same_owner`` this owner name held it (a restarted process)
``took_over_expired``       another owner's lease expired by the store's clock
==========================  ======================================================
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from jixu.errors import ConcurrencyError, FencingError, JixuError
from jixu.kernel.commits import Commits
from jixu.kernel.writer import StreamWriter
from jixu.ledger.event import NewEvent
from jixu.ledger.store import Fence, Lease, Store


@dataclass(frozen=True, slots=True)
class Claim:
    """A lease taken for one owner: the fence and what it took over."""

    fence: Fence
    reason: str
    """``claimed``, ``continued``, ``reclaimed_by_same_owner`` or ``took_over_expired``."""
    previous_owner: str | None
    previous_epoch: int

    def record(self) -> dict[str, Any]:
        """The fields every ``*.claimed`` event carries."""
        return {"owner": self.fence.owner, "epoch": self.fence.epoch, "reason": self.reason,
                "previous_owner": self.previous_owner, "previous_epoch": self.previous_epoch}


def take_claim(store: Store, key: str, owner: str, ttl: float) -> Claim:
    """Take ``key``'s lease for ``owner`` at the next epoch.

    Another owner's lease is taken only once it expired by the store's clock
    (:class:`~jixu.errors.LeaseHeld` otherwise); a lease that changed hands
    since it was read raises :class:`~jixu.errors.FencingError`.
    """
    lease = store.get_lease(key)
    if lease is None:
        reason, previous_owner, previous_epoch, require_expired = "claimed", None, 0, False
    else:
        previous_owner, previous_epoch = lease.owner, lease.epoch
        if lease.released:
            reason, require_expired = "continued", False
        elif lease.owner == owner:
            reason, require_expired = "reclaimed_by_same_owner", False
        else:
            reason, require_expired = "took_over_expired", True
    fence = store.take_over_lease(key, owner, ttl, expected_epoch=previous_epoch, require_expired=require_expired)
    return Claim(fence, reason, previous_owner, previous_epoch)


def acquire_claim(store: Store, key: str, owner: str, ttl: float) -> Fence:
    """Take ``key``'s lease for ``owner`` (the same epoch when ``owner`` holds it already; the next one once
    it was released or expired; :class:`~jixu.errors.LeaseHeld` while another owner's is live)."""
    return store.acquire_lease(key, owner, ttl)


def recovery_claim(store: Store, key: str, recoverer: str, ttl: float, *, expected_epoch: int,
                   require_expired: bool) -> tuple[Fence, Lease | None]:
    """An explicit recovery's claim on ``key``: ``(its fence, the lease it found)``.

    The store checks that the lease is still at ``expected_epoch`` (the one
    the operator looked at) and, with ``require_expired``, that it expired by
    the store's clock, and moves it to the next epoch; a late write of the
    former owner is refused from then on. The same recovery repeated after it
    took the lease (and stopped before recording its receipt) gets that claim
    back, renewed.
    """
    previous = store.get_lease(key)
    if previous is not None and previous.owner == recoverer and previous.epoch == expected_epoch + 1:
        fence = previous.fence()
        store.renew_lease(fence, ttl)
        return fence, previous
    return store.take_over_lease(key, recoverer, ttl, expected_epoch=expected_epoch,
                                 require_expired=require_expired), previous


def holds(store: Store, fence: Fence | None) -> bool:
    """Whether ``fence`` is still the current, unreleased holder of its lease (by owner and epoch)."""
    if fence is None:
        return False
    lease = store.get_lease(fence.key)
    return lease is not None and not lease.released and (lease.owner, lease.epoch) == (fence.owner, fence.epoch)


def claim_stream(writer: StreamWriter[Any], key: str, owner: str, ttl: float,
                 claimed: Callable[[Claim], NewEvent], *, still_wanted: Callable[[], bool],
                 tries: int = 5) -> Claim | None:
    """Take ``key``'s lease and record ``claimed(claim)`` in ``writer``'s stream, fenced by it.

    When another writer moved the head meanwhile, the new events are folded
    and, while ``still_wanted()`` (there is still work to do), the claim is
    recorded again after them; otherwise the lease is given back and ``None``
    returned.
    """
    claim = take_claim(writer.store, key, owner, ttl)
    for _ in range(tries):
        try:
            writer.append([claimed(claim)], claim.fence)
            return claim
        except ConcurrencyError:
            writer.sync()
            if not still_wanted():
                break
    release(writer.store, claim.fence)
    return None


def release(store: Store, fence: Fence | None) -> None:
    """Give the lease back (nothing if it was lost meanwhile)."""
    if fence is not None:
        with contextlib.suppress(JixuError):
            store.release_lease(fence)


class Session:
    """An owner at work on a claim: renews the lease every ``ttl / 3`` seconds against the store's clock, counts
    the owner as a running user of the loop's commits, and releases the lease at the end (``async with``).

    When a renewal finds the claim lost (:class:`~jixu.errors.FencingError`),
    the task that opened the session is cancelled and :attr:`lost` says why;
    the owner's next fenced append would fail anyway.
    """

    def __init__(self, store: Store, fence: Fence, ttl: float, *, release_at_end: bool = True) -> None:
        self.store = store
        self.fence = fence
        self.ttl = ttl
        self.lost: FencingError | None = None
        self._release_at_end = release_at_end
        self._heartbeat: asyncio.Task[None] | None = None
        self._owner_task: asyncio.Task[Any] | None = None
        self._user: contextlib.ExitStack | None = None

    async def __aenter__(self) -> Session:
        self._owner_task = asyncio.current_task()
        self._user = contextlib.ExitStack()
        self._user.enter_context(Commits.of(self.store).user())
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat(), name=f"jixu-heartbeat {self.fence.key}")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._user is not None:
            self._user.close()
        if self._release_at_end:
            release(self.store, self.fence)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                self.store.renew_lease(self.fence, self.ttl)
            except FencingError as error:
                self.lost = error
                if self._owner_task is not None:
                    self._owner_task.cancel()
                return


__all__ = ["Claim", "Session", "acquire_claim", "claim_stream", "holds", "recovery_claim", "release", "take_claim"]
