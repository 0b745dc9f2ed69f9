"""Renewals of one store's claims by every owner on one event loop, sent together (decision 0042).

A worker running hundreds of turns renews a lease (and a work claim) for each
of them every few seconds. Sent one by one, each renewal is a transaction of
its own: a commit on SQLite, four or five round trips on PostgreSQL, and
Python work in a thread that competes with the turns for the interpreter.
Here an owner's renewal waits up to :data:`WINDOW` seconds for the others due
about then, and all of them go to the store in one call
(:meth:`~jixu.ledger.Store.renew_leases`,
:meth:`~jixu.ledger.Store.renew_work_claims`: one transaction), in a thread,
never on the loop. Each owner gets its own answer: its renewed claim, or the
:class:`~jixu.errors.FencingError` saying it lost it; a failure of the whole
call (the store is down) is every owner's.

The window costs an owner at most :data:`WINDOW` of its renewal period
(a third of its lease, 3 s by default).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from jixu.errors import FencingError
from jixu.kernel.commits import PerLoop, for_this_loop, settle
from jixu.kernel.shutdown import ServingTask
from jixu.ledger import Fence, Lease, Store, WorkClaim

WINDOW = 0.05
"""Seconds a renewal waits for others to go with it."""

_Held = TypeVar("_Held")
_Renewed = TypeVar("_Renewed")


class Renewals(Generic[_Held, _Renewed]):
    """The renewals of one kind (leases or work claims) of one store on one event loop."""

    def __init__(self, renew_all: Callable[[Sequence[_Held], float], list[_Renewed | FencingError]]) -> None:
        self._renew_all = renew_all
        self._pending: list[tuple[_Held, float, asyncio.Future[_Renewed]]] = []
        self._sending: list[tuple[_Held, float, asyncio.Future[_Renewed]]] = []
        """The renewals of the call in flight."""
        self._sender: asyncio.Task[None] | None = None

    async def renew(self, held: _Held, ttl: float) -> _Renewed:
        """``held`` renewed for ``ttl`` seconds, with the others due now; raises what its renewal raised."""
        future: asyncio.Future[_Renewed] = asyncio.get_running_loop().create_future()
        self._pending.append((held, ttl, future))
        if self._sender is None or self._sender.done():
            # A serving task: a loop's shutdown leaves it running while a call is in flight (its claim).
            self._sender = ServingTask(self._send(), name="jixu-renewals")
        return await future

    async def _send(self) -> None:
        try:
            while self._pending:
                await asyncio.sleep(WINDOW)
                batch = self._sending = self._pending
                self._pending = []
                by_ttl: dict[float, list[tuple[_Held, asyncio.Future[_Renewed]]]] = {}
                for held, ttl, future in batch:
                    if not future.done():  # its owner stopped waiting (cancelled): nothing to renew
                        by_ttl.setdefault(ttl, []).append((held, future))
                for ttl, group in by_ttl.items():
                    try:
                        answers = await asyncio.to_thread(self._renew_all, [held for held, _f in group], ttl)
                    except Exception as error:  # the store failed: every owner of the call hears it
                        for _held, future in group:
                            settle(future, error)
                        continue
                    for (_held, future), answer in zip(group, answers, strict=True):
                        settle(future, answer)  # its renewed claim, or the FencingError saying it lost it
        finally:
            # Cancelled (the loop is going away): nobody is left to send or answer what is still waiting.
            for _held, _ttl, future in self._sending + self._pending:
                if not future.done():
                    future.cancel()
            self._sending, self._pending = [], []


_BY_LOOP: PerLoop[tuple[Renewals[Fence, Lease], Renewals[WorkClaim, WorkClaim]]] = weakref.WeakKeyDictionary()


def _of(store: Store) -> tuple[Renewals[Fence, Lease], Renewals[WorkClaim, WorkClaim]]:
    return for_this_loop(_BY_LOOP, store, lambda: (Renewals(store.renew_leases), Renewals(store.renew_work_claims)))


def lease_renewals(store: Store) -> Renewals[Fence, Lease]:
    """The lease renewals of ``store`` on the running event loop (made on first use)."""
    return _of(store)[0]


def work_renewals(store: Store) -> Renewals[WorkClaim, WorkClaim]:
    """The work-claim renewals of ``store`` on the running event loop (made on first use)."""
    return _of(store)[1]


__all__ = ["WINDOW", "Renewals", "lease_renewals", "work_renewals"]
