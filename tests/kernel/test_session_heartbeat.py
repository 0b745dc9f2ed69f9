"""A turn's lease is renewed off the event loop: a slow renewal never holds the other turns on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from jixu.errors import FencingError, StoreLocked
from jixu.kernel.ownership import Session
from jixu.ledger import Fence, Lease, SQLiteStore


class SlowRenewals(SQLiteStore):
    """A store whose renewals take ``delay`` seconds (a slow disk, a far database)."""

    delay = 0.3

    def renew_leases(self, fences: Sequence[Fence], ttl: float) -> list[Lease | FencingError]:
        time.sleep(self.delay)
        return super().renew_leases(fences, ttl)


def test_a_slow_renewal_does_not_hold_the_loop_and_the_lease_is_renewed(tmp_path: Path) -> None:
    async def scenario(store: SlowRenewals) -> tuple[float, float, float]:
        fence = store.acquire_lease("thread/t/turn", "worker-1", 0.6)
        before = store.get_lease("thread/t/turn")
        assert before is not None
        late = 0.0
        async with Session(store, fence, 0.6, release_at_end=False):  # a beat every 0.2 s
            started = time.monotonic()
            while time.monotonic() - started < 1.2:
                asked = time.monotonic()
                await asyncio.sleep(0.01)
                late = max(late, time.monotonic() - asked - 0.01)
        after = store.get_lease("thread/t/turn")
        assert after is not None
        return late, before.expires_at, after.expires_at

    with SlowRenewals(tmp_path / "slow.db") as store:
        late, first_expiry, last_expiry = asyncio.run(scenario(store))
    # Renewing on the loop would hold every sleeper for the renewal's 0.3 s, several times.
    assert late < 0.15, f"the loop was held {late:.3f} s"
    assert last_expiry > first_expiry, "the heartbeat renewed the lease"


class FlakyRenewals(SQLiteStore):
    """A store whose first renewal fails as a busy database does (the lock held past the busy timeout)."""

    failures = 1

    def renew_leases(self, fences: Sequence[Fence], ttl: float) -> list[Lease | FencingError]:
        if self.failures:
            self.failures -= 1
            raise StoreLocked(f"{self.path}: the database stayed locked", path=str(self.path))
        return super().renew_leases(fences, ttl)


def test_a_renewal_that_fails_for_the_store_is_tried_again_and_the_turn_keeps_its_lease(tmp_path: Path) -> None:
    """A failed renewal (not a lost claim) must not end the heartbeat: the lease would lapse under a live owner
    and the turn be lost at its next append."""
    ttl = 1.5  # a beat every 0.5 s; the first one fails

    async def scenario(store: FlakyRenewals) -> tuple[bool, Lease | None]:
        fence = store.acquire_lease("thread/t/turn", "worker-1", ttl)
        session = Session(store, fence, ttl, release_at_end=False)
        async with session:
            await asyncio.sleep(2.5 * ttl)  # past the expiry of a lease renewed never again
            cancelled = asyncio.current_task().cancelling() > 0  # type: ignore[union-attr]
        return cancelled, store.get_lease("thread/t/turn")

    with FlakyRenewals(tmp_path / "flaky.db") as store:
        cancelled, lease = asyncio.run(scenario(store))
        now = time.time()
    assert store.failures == 0, "the first renewal failed"
    assert not cancelled
    assert lease is not None and lease.owner == "worker-1" and not lease.released
    assert lease.expires_at > now, f"the lease lapsed {now - lease.expires_at:.2f} s ago: the heartbeat stopped"
