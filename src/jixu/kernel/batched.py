"""Calls of one kind to one store by every owner on one event loop, sent together (decision 0042, 0044).

A worker running hundreds of turns renews a lease (and a work claim) for each
of them every few seconds, and takes a turn's lease for each turn it starts.
Sent one by one, each is a transaction of its own: a commit on SQLite (a
take-over waits for the disk), four or five round trips on PostgreSQL, and
Python work that competes with the turns for the interpreter. Here an owner's
call waits for the others due about then (renewals: up to :data:`WINDOW`
seconds; take-overs: only while the call before is in flight), and all of
them go to the store in one call (:meth:`~jixu.ledger.Store.renew_leases`,
:meth:`~jixu.ledger.Store.renew_work_claims`,
:meth:`~jixu.ledger.Store.take_over_leases`: one transaction each), in a
thread of their own, never on the loop, and never in the loop's default
executor, where plain ``def`` tools run: tools blocking every thread of that
pool never hold a renewal (the claim would expire under a live owner). Each
owner gets its own answer: its renewed claim or fence, or the error refusing
it; a failure of the whole call (the store is down) is every owner's.

The window costs a renewal at most :data:`WINDOW` of its period (a third of
its lease, 3 s by default).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from jixu.errors import FencingError, JixuError
from jixu.kernel.commits import PerLoop, for_this_loop, settle
from jixu.kernel.shutdown import ServingTask
from jixu.ledger import Fence, Lease, LeaseTake, Store, WorkClaim

WINDOW = 0.05
"""Seconds a renewal waits for others to go with it."""

_Asked = TypeVar("_Asked")
_Answer = TypeVar("_Answer")
_Held = TypeVar("_Held")
_Renewed = TypeVar("_Renewed")


class Batched(Generic[_Asked, _Answer]):
    """The calls of one kind (lease renewals, work-claim renewals, lease take-overs) of one store on one loop.

    ``send_all(asked)`` answers every one of ``asked`` in one store call, in
    order: each its answer, or the :class:`~jixu.errors.JixuError` refusing it.
    """

    def __init__(self, send_all: Callable[[list[_Asked]], Sequence[_Answer | JixuError]], *, window: float,
                 name: str, thread: Callable[[], ThreadPoolExecutor]) -> None:
        self._send_all = send_all
        self._window = window
        self._name = name
        self._thread = thread
        self._pending: list[tuple[_Asked, asyncio.Future[_Answer]]] = []
        self._sending: list[tuple[_Asked, asyncio.Future[_Answer]]] = []
        """The calls in flight."""
        self._sender: asyncio.Task[None] | None = None
        self.calls = 0
        """Store calls made (each answered one or more owners)."""

    async def ask(self, asked: _Asked) -> _Answer:
        """``asked`` sent with the others due now: its answer; raises the error refusing it."""
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._pending.append((asked, future))
        if self._sender is None or self._sender.done():
            # A serving task: a loop's shutdown leaves it running while a call is in flight (its claim).
            self._sender = ServingTask(self._send(), name=self._name)
        return await future

    async def _send(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                await asyncio.sleep(self._window)  # 0: the owners already on their way join too
                batch = self._sending = [(asked, future) for asked, future in self._pending
                                         if not future.done()]  # one that stopped waiting asks nothing
                self._pending = []
                if not batch:
                    continue
                try:
                    answers = await loop.run_in_executor(self._thread(), self._send_all,
                                                         [asked for asked, _future in batch])
                    self.calls += 1
                except Exception as error:  # the store failed: every owner of the call hears it
                    for _asked, future in batch:
                        settle(future, error)
                    continue
                for (_asked, future), answer in zip(batch, answers, strict=True):
                    settle(future, answer)  # its answer, or the error refusing it
                self._sending = []
        finally:
            # Cancelled (the loop is going away): nobody is left to send or answer what is still waiting.
            for _asked, future in self._sending + self._pending:
                if not future.done():
                    future.cancel()
            self._sending, self._pending = [], []


class Renewals(Batched[tuple[_Held, float], _Renewed]):
    """The renewals of one kind (leases or work claims) of one store on one event loop."""

    def __init__(self, renew_all: Callable[[Sequence[_Held], float], list[_Renewed | FencingError]], *,
                 thread: Callable[[], ThreadPoolExecutor] | None = None, name: str = "jixu-renewals") -> None:
        def send_all(asked: list[tuple[_Held, float]]) -> list[_Renewed | JixuError]:
            answers: list[_Renewed | JixuError | None] = [None] * len(asked)
            by_ttl: dict[float, list[int]] = {}
            for index, (_held, ttl) in enumerate(asked):
                by_ttl.setdefault(ttl, []).append(index)
            for ttl, indexes in by_ttl.items():  # one ttl in practice: an owner's leases all have its ttl
                for index, answer in zip(indexes, renew_all([asked[i][0] for i in indexes], ttl), strict=True):
                    answers[index] = answer
            return [answer for answer in answers if answer is not None]

        super().__init__(send_all, window=WINDOW, name=name, thread=thread or _own_thread())

    async def renew(self, held: _Held, ttl: float) -> _Renewed:
        """``held`` renewed for ``ttl`` seconds, with the others due now; raises what its renewal raised."""
        return await self.ask((held, ttl))


def _own_thread() -> Callable[[], ThreadPoolExecutor]:
    """A getter of one thread, made on first use."""
    made: list[ThreadPoolExecutor] = []

    def thread() -> ThreadPoolExecutor:
        if not made:
            made.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="jixu-claims"))
        return made[0]

    return thread


class _OfStore:
    """A store's batched calls on one loop, sharing one thread."""

    def __init__(self, store: Store) -> None:
        thread = _own_thread()
        self.lease_renewals: Renewals[Fence, Lease] = Renewals(store.renew_leases, thread=thread)
        self.work_renewals: Renewals[WorkClaim, WorkClaim] = Renewals(store.renew_work_claims, thread=thread)
        self.lease_takes: Batched[LeaseTake, Fence] = Batched(store.take_over_leases, window=0.0,
                                                              name="jixu-lease-takes", thread=thread)


_BY_LOOP: PerLoop[_OfStore] = weakref.WeakKeyDictionary()


def _of(store: Store) -> _OfStore:
    return for_this_loop(_BY_LOOP, store, lambda: _OfStore(store))


def lease_renewals(store: Store) -> Renewals[Fence, Lease]:
    """The lease renewals of ``store`` on the running event loop (made on first use)."""
    return _of(store).lease_renewals


def work_renewals(store: Store) -> Renewals[WorkClaim, WorkClaim]:
    """The work-claim renewals of ``store`` on the running event loop (made on first use)."""
    return _of(store).work_renewals


def lease_takes(store: Store) -> Batched[LeaseTake, Fence]:
    """The lease take-overs of ``store`` on the running event loop (made on first use)."""
    return _of(store).lease_takes


__all__ = ["WINDOW", "Batched", "Renewals", "lease_renewals", "lease_takes", "work_renewals"]
