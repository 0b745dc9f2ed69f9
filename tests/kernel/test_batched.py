"""Renewals due together go to the store in one call; each owner gets its own answer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from jixu.errors import FencingError, StoreError
from jixu.kernel.batched import lease_renewals, work_renewals
from jixu.kernel.ownership import Session
from jixu.ledger import Fence, Lease, SQLiteStore, WorkClaim


class CountingStore(SQLiteStore):
    """A real SQLite store that counts its batch renewals (and can be told to fail them)."""

    batches: list[int]
    fail = False

    def renew_leases(self, fences: Sequence[Fence], ttl: float) -> list[Lease | FencingError]:
        self.batches.append(len(fences))
        if self.fail:
            raise StoreError("the database went away")
        return super().renew_leases(fences, ttl)


def test_fifty_owners_due_together_renew_in_one_call_and_a_lost_one_alone_hears_it(tmp_path: Path) -> None:
    async def scenario(store: CountingStore) -> list[object]:
        fences = [store.acquire_lease(f"thread/{i}/turn", "worker-1", 30) for i in range(50)]
        store.take_over_lease("thread/7/turn", "worker-2", 30, expected_epoch=1, require_expired=False)
        renewals = lease_renewals(store)
        assert lease_renewals(store) is renewals, "one per store and loop"
        return list(await asyncio.gather(*(renewals.renew(f, 60) for f in fences), return_exceptions=True))

    with CountingStore(tmp_path / "q.db") as store:
        store.batches = []
        answers = asyncio.run(scenario(store))
        assert store.batches == [50], "one call for all fifty"
        assert isinstance(answers[7], FencingError)
        assert all(isinstance(a, Lease) and a.key == f"thread/{i}/turn" for i, a in enumerate(answers) if i != 7)
        lease = store.get_lease("thread/3/turn")
        assert lease is not None and lease.expires_at > store.now() + 50


def test_a_failed_call_is_every_owners_failure(tmp_path: Path) -> None:
    async def scenario(store: CountingStore) -> list[object]:
        fences = [store.acquire_lease(f"thread/{i}/turn", "worker-1", 30) for i in range(3)]
        store.fail = True
        return list(await asyncio.gather(*(lease_renewals(store).renew(f, 60) for f in fences),
                                         return_exceptions=True))

    with CountingStore(tmp_path / "q.db") as store:
        store.batches = []
        answers = asyncio.run(scenario(store))
    assert [type(a) for a in answers] == [StoreError] * 3


def test_work_claims_renew_together(tmp_path: Path) -> None:
    async def scenario(store: SQLiteStore) -> list[WorkClaim]:
        for i in range(5):
            store.enqueue(f"thread:{i}", "fleet")
        claims = [store.claim_work("w", 5.0, lambda census: ["fleet"]) for _ in range(5)]
        held = [c for c in claims if c is not None]
        return list(await asyncio.gather(*(work_renewals(store).renew(c, 30.0) for c in held)))

    with SQLiteStore(tmp_path / "q.db") as store:
        renewed = asyncio.run(scenario(store))
        assert [c.key for c in renewed] == [f"thread:{i}" for i in range(5)]
        assert all(c.expires_at > store.now() + 25 for c in renewed)


def test_a_session_that_loses_its_lease_in_a_batch_cancels_its_owner(tmp_path: Path) -> None:
    async def scenario(store: SQLiteStore) -> FencingError | None:
        fence = store.acquire_lease("thread/t/turn", "worker-1", 0.3)
        session = Session(store, fence, 0.3, release_at_end=False)

        async def owner() -> None:
            async with session:
                store.take_over_lease("thread/t/turn", "worker-2", 30, expected_epoch=1, require_expired=False)
                await asyncio.sleep(5)

        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(owner(), 3)
        return session.lost

    with SQLiteStore(tmp_path / "q.db") as store:
        lost = asyncio.run(scenario(store))
    assert isinstance(lost, FencingError)


def test_an_owner_waiting_on_a_cancelled_sender_is_not_left_waiting() -> None:
    import time

    from jixu.kernel.batched import Renewals

    def slow(items: Sequence[str], ttl: float) -> list[str | FencingError]:
        time.sleep(0.2)
        return [f"{item} renewed" for item in items]

    async def scenario() -> tuple[str, bool]:
        renewals: Renewals[str, str] = Renewals(slow)
        first = await renewals.renew("a", 1.0)
        waiting = asyncio.create_task(renewals.renew("b", 1.0))
        await asyncio.sleep(0.1)  # its call is in flight now
        assert renewals._sender is not None
        renewals._sender.cancel()
        try:
            await asyncio.wait_for(waiting, 2)
        except asyncio.CancelledError:
            return first, True
        return first, False

    first, cancelled = asyncio.run(scenario())
    assert first == "a renewed" and cancelled


def test_a_hundred_turns_starting_together_take_their_leases_in_few_calls(tmp_path: Path) -> None:
    """Take-overs wait for no window, only for the call in flight: 100 starting together need a handful of
    transactions, not 100; one refused (its lease is held) hears it alone."""
    from jixu.errors import LeaseHeld
    from jixu.kernel.batched import lease_takes
    from jixu.kernel.ownership import take_claim

    async def scenario(store: SQLiteStore) -> tuple[list[object], int]:
        store.acquire_lease("thread/held/turn", "worker-2", 30)
        keys = [f"thread/{i}/turn" for i in range(100)] + ["thread/held/turn"]
        answers = await asyncio.gather(*(take_claim(store, key, "worker-1", 30) for key in keys),
                                       return_exceptions=True)
        return list(answers), lease_takes(store).calls

    with SQLiteStore(tmp_path / "q.db") as store:
        answers, calls = asyncio.run(scenario(store))
        assert isinstance(answers[-1], LeaseHeld)
        assert [a.fence.key for a in answers[:-1]] == [f"thread/{i}/turn" for i in range(100)]  # type: ignore[union-attr]
        assert 1 <= calls <= 5, f"{calls} transactions for 101 take-overs"
        held = store.get_lease("thread/held/turn")
        assert held is not None and held.owner == "worker-2"


def test_renewals_are_answered_while_every_thread_of_the_loops_executor_is_blocked(tmp_path: Path) -> None:
    """Plain ``def`` tools run in the loop's default executor: blocking all of it must not hold a renewal
    (the claim would expire under its live owner)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    async def scenario(store: SQLiteStore) -> Lease:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
        release = threading.Event()
        blocked = [loop.run_in_executor(None, release.wait) for _ in range(2)]
        try:
            fence = store.acquire_lease("thread/t/turn", "worker-1", 30)
            return await asyncio.wait_for(lease_renewals(store).renew(fence, 60), 10)
        finally:
            release.set()
            await asyncio.gather(*blocked)

    with SQLiteStore(tmp_path / "q.db") as store:
        renewed = asyncio.run(scenario(store))
        assert renewed.expires_at > store.now() + 50


def test_a_claim_cancelled_while_its_take_is_in_flight_gives_the_lease_back(tmp_path: Path) -> None:
    """The take is durable once answered even if nobody waits for it any more: the cancelled claim must give
    it back, or the key stays held by a live-looking owner until its lease expires."""
    import threading

    from jixu.kernel.ownership import take_claim
    from jixu.ledger import LeaseTake

    class HeldTakes(SQLiteStore):
        entered: threading.Event
        gate: threading.Event

        def take_over_leases(self, takes: Sequence[LeaseTake]) -> list[Fence | FencingError]:
            self.entered.set()
            self.gate.wait(10)
            return super().take_over_leases(takes)

    async def scenario(store: HeldTakes) -> Lease | None:
        claim = asyncio.create_task(take_claim(store, "thread/t/turn", "worker-1", 60))
        while not store.entered.is_set():
            await asyncio.sleep(0.005)
        claim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claim
        store.gate.set()  # the take now commits, for nobody
        for _ in range(500):
            lease = store.get_lease("thread/t/turn")
            if lease is not None and lease.released:
                return lease
            await asyncio.sleep(0.01)
        return store.get_lease("thread/t/turn")

    with HeldTakes(tmp_path / "q.db") as store:
        store.entered, store.gate = threading.Event(), threading.Event()
        lease = asyncio.run(scenario(store))
        assert lease is not None and lease.owner == "worker-1" and lease.released, lease
        taken = store.acquire_lease("thread/t/turn", "worker-2", 30)  # at once: nothing to wait out
        assert taken.epoch == lease.epoch + 1
