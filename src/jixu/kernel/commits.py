"""The one commit path of a store on one asyncio event loop: appends of the loop's tasks share commits.

A store's ``append`` is synchronous: called from a coroutine, it holds the
whole event loop until its commit is durable, so tasks that share a loop
would never share a commit and every other task would wait for each fsync.
:class:`Commits` is what every asynchronous append of the kernel goes
through (threads' agent loops, runs, ``send``, the workers of ``jixu
worker`` and ``jixu serve``): one commit at a time runs, carrying every
append that arrived while the previous one ran, through
:meth:`Store.append_many` (SQLite: one transaction, one fsync).

Where a commit runs, by one rule:

* **At once, in the caller** (no task, no future, no yield), when the caller
  is a running *user* (an agent loop or a run session, counted with
  :meth:`Commits.user`) and no other user runs and nothing is queued or
  committing: there is nobody to share the commit with, and nobody who could
  run meanwhile. This is what a single thread's loop does at every step.
* **In the loop's own thread**, when every running user waits for this very
  commit: none of them could run during it anyway (decision 0021).
* **In a worker thread** otherwise (some running user is busy with a model
  or a tool, or the appends are not a user's, e.g. turns starting): the loop
  keeps serving them while the commit's fsync runs. That thread is this
  commit path's own, not the loop's default executor, where plain ``def``
  tools run: tools blocking every thread of that pool never hold a commit.

Each waiter gets exactly what ``append`` would have given it: its stored
events once they are durable, or its own error. A waiter cancelled while its
append is queued or committing does not take the append back (it may already
be durable): its future refuses cancellation, so the waiter is told once the
commit's verdict is in (:class:`Commitment`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeAlias, TypeVar

from jixu.errors import JixuError, OutcomeUnknown, StoreError
from jixu.kernel.shutdown import ServingTask
from jixu.ledger.event import Event, NewEvent, PreparedEvent
from jixu.ledger.store import AppendRequest, Fence, Store


class Commitment(asyncio.Future[list[Event]]):
    """The answer to one queued append: a future that :meth:`cancel` leaves alone.

    Its append may already be durable, so no one may take it back. A task
    cancelled while it awaits one is told so (``CancelledError`` at its
    ``await``) when the commit's verdict is in, and can still read that
    verdict from the future.
    """

    def cancel(self, msg: object = None) -> bool:
        """Refuse: the append may already be durable (returns False, changes nothing)."""
        return False

    in_doubt_since: float | None = None
    """Loop time of the first commit of this append whose outcome was unknown (see :data:`IN_DOUBT_SECONDS`)."""
    in_doubt_tries = 0
    """Commits of this append made again since."""

    def abandon(self) -> None:
        """Cancel it for real: only for an append that was never started (nothing of it was written)."""
        super().cancel()


IN_DOUBT_SECONDS = 30.0
"""How long an append whose commit had an unknown outcome (:class:`~jixu.errors.OutcomeUnknown`: the connection
broke before the answer, the commit failed) is committed again: the same ids, so one that was stored is
answered as it was stored, one that was not is stored now. A receipt then survives a database that restarts
under it; only when the store stays unreachable longer does its error (the receipts kept in it) reach the
caller."""
IN_DOUBT_BACKOFF = (0.05, 1.0)
"""First and longest wait between those commits (doubling)."""


_T = TypeVar("_T")
PerLoop: TypeAlias = weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[Store, _T]]
"""What the kernel keeps per event loop and store (a loop's commits, its renewals), gone with either."""


def for_this_loop(registry: PerLoop[_T], store: Store, make: Callable[[], _T]) -> _T:
    """``registry``'s object for ``store`` on the running event loop, made by ``make`` on first use."""
    loop = asyncio.get_running_loop()
    per_store = registry.get(loop)
    if per_store is None:
        per_store = registry[loop] = weakref.WeakKeyDictionary()
    found = per_store.get(store)
    if found is None:
        found = per_store[store] = make()
    return found


def settle(future: asyncio.Future[_T], outcome: _T | BaseException) -> None:
    """Give ``future`` its ``outcome`` unless it is done already: raised in it when an exception, else its
    result (the answers of the kernel's shared calls: commits, renewals)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


_BY_LOOP: PerLoop[Commits] = weakref.WeakKeyDictionary()


class Commits:
    """The shared commits of one store on one event loop (see the module docstring); get it with :meth:`of`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._waiting: list[tuple[AppendRequest, Commitment, bool]] = []
        self._committing = False
        self._task: asyncio.Task[None] | None = None
        self.running = 0
        """Users running now (agent loops and run sessions of this loop, see :meth:`user`)."""
        self.commits = 0
        """Commits made (each carried one or more appends)."""
        self.commits_at_once = 0
        """Of :attr:`commits`, those made at once by their only possible user (no queue, no yield)."""
        self.commits_in_loop = 0
        """Of :attr:`commits`, those queued and made in the loop's own thread (every running user waited)."""
        self.appends = 0
        """Appends committed (or refused) through this path."""
        self._thread: ThreadPoolExecutor | None = None
        """The one thread commits run in when not in the loop's (made on first use; one commit runs at a time)."""

    @classmethod
    def of(cls, store: Store) -> Commits:
        """The commit path of ``store`` on the running event loop (made on first use)."""
        return for_this_loop(_BY_LOOP, store, lambda: cls(store))

    @contextmanager
    def user(self) -> Iterator[None]:
        """Count the caller (an agent loop, a run session) as a running user while the block runs."""
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1

    def alone(self) -> bool:
        """Whether a running user's append made now is committed at once: no other user runs, nothing waits."""
        return self.running <= 1 and not self._committing and not self._waiting

    def append_now(self, stream: str, events: Sequence[NewEvent | PreparedEvent], expected_seq: int,
                   fence: Fence | None) -> list[Event]:
        """Commit at once, in the caller, holding the loop (for an append that must not yield: see
        :meth:`jixu.kernel.writer.StreamWriter.stage`)."""
        stored = self.store.append(stream, events, expected_seq, fence)
        self.commits += 1
        self.commits_at_once += 1
        self.appends += 1
        return stored

    async def append(self, stream: str, events: Sequence[NewEvent | PreparedEvent], expected_seq: int,
                     fence: Fence | None = None, *, user: bool = False) -> list[Event]:
        """:meth:`Store.append` on the shared path; ``user``: the caller is a running user waiting for it."""
        if user and self.alone():
            try:
                return self.append_now(stream, events, expected_seq, fence)
            except OutcomeUnknown:  # committed again on the shared path, which waits without holding the loop
                return await self.submit(stream, events, expected_seq, fence, user=user, in_doubt=True)
        return await self.submit(stream, events, expected_seq, fence, user=user)

    def submit(self, stream: str, events: Sequence[NewEvent | PreparedEvent], expected_seq: int,
               fence: Fence | None = None, *, user: bool = False, in_doubt: bool = False) -> Commitment:
        """Queue an append for the next shared commit; the future gets what :meth:`Store.append` would give.

        ``in_doubt``: an earlier commit of these events had an unknown outcome (committed again while the store
        does not answer, as one that met it here)."""
        loop = asyncio.get_running_loop()
        future = Commitment(loop=loop)
        if in_doubt:
            future.in_doubt_since = loop.time()
        self._waiting.append((AppendRequest(stream, events, expected_seq, fence), future, user))
        if not self._committing:
            self._committing = True
            # Kept referenced: the loop holds tasks only weakly.
            # A ServingTask: a loop's shutdown leaves it committing while a call is in flight (decision 0036).
            self._task = ServingTask(self._commit_all(), loop=loop, name="jixu-commits")
            self._task.add_done_callback(self._abandon_if_never_run)
        return future

    def _abandon_if_never_run(self, task: asyncio.Task[None]) -> None:
        """A commit task cancelled before its first step (``asyncio.run`` cancels every task on its way out)
        never ran :meth:`_commit_all`, not even its ``finally``: nothing queued was started, so abandon it all
        (its waiters are told by cancellation, not left waiting forever) and let the next append start anew."""
        if task is self._task and self._committing and task.cancelled():
            waiting, self._waiting = self._waiting, []
            for _request, future, _user in waiting:
                future.abandon()
            self._committing = False

    async def _commit_all(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                users = sum(1 for _request, _future, user in batch if user)
                in_loop = 0 < users >= self.running
                try:
                    answers, cancelled = await self._commit([request for request, _future, _user in batch], in_loop)
                except BaseException as interrupted:
                    # KeyboardInterrupt or SystemExit out of a commit made in the loop's thread: it goes on up, but
                    # no waiter of this commit may be left waiting forever (asyncio.run would hang cancelling it).
                    unknown = StoreError(f"{self.store.url}: the shared commit was interrupted "
                                         f"({type(interrupted).__name__}); whether it is durable is not known")
                    for _request, future, _user in batch:
                        settle(future, unknown)
                    # Appends queued behind it were never started: nothing of them was written.
                    waiting, self._waiting = self._waiting, []
                    for _request, future, _user in waiting:
                        future.abandon()
                    raise
                if isinstance(answers, BaseException):  # the whole commit failed: every append in it fails
                    failure = answers if isinstance(answers, JixuError) else StoreError(
                        f"{self.store.url}: the shared commit failed ({type(answers).__name__}: {answers})")
                    results: list[list[Event] | JixuError] = [failure] * len(batch)
                else:
                    results = answers
                self.commits += 1
                self.commits_in_loop += in_loop
                self.appends += len(batch)
                again = []
                for (request, future, user), result in zip(batch, results, strict=True):
                    if self._in_doubt(future, result) and not cancelled and self._again(future):
                        again.append((request, future, user))
                    else:
                        settle(future, result)
                if again:
                    # In doubt: committed again (before what queued meanwhile, in order) once the store may be back.
                    tries = max(future.in_doubt_tries for _request, future, _user in again)
                    await asyncio.sleep(min(IN_DOUBT_BACKOFF[0] * 2 ** tries, IN_DOUBT_BACKOFF[1]))
                    self._waiting[:0] = again
                if cancelled:
                    # The loop is shutting down (its tasks are cancelled): appends still queued were never
                    # started, so nothing of them was written; their waiters are told so by cancellation.
                    waiting, self._waiting = self._waiting, []
                    for _request, future, _user in waiting:
                        future.abandon()
                    raise asyncio.CancelledError
        finally:
            self._committing = False

    def _in_doubt(self, future: Commitment, result: object) -> bool:
        """Whether ``result`` leaves the append's outcome unknown: :class:`~jixu.errors.OutcomeUnknown`, or,
        once it was, any store error but a closed store's (the store unreachable while it restarts)."""
        if isinstance(result, OutcomeUnknown):
            return True
        return future.in_doubt_since is not None and type(result) is StoreError and not self.store.closed

    @staticmethod
    def _again(future: Commitment) -> bool:
        """Whether an append whose commit had an unknown outcome is committed again (within
        :data:`IN_DOUBT_SECONDS` of the first such commit); counts the try."""
        now = asyncio.get_running_loop().time()
        if future.in_doubt_since is None:
            future.in_doubt_since = now
        elif now - future.in_doubt_since > IN_DOUBT_SECONDS:
            return False
        future.in_doubt_tries += 1
        return True

    async def _commit(self, requests: list[AppendRequest], in_loop: bool,
                      ) -> tuple[list[list[Event] | JixuError] | Exception, bool]:
        """Run one shared commit, in the loop's thread or a worker thread: ``(its answers or its error, whether
        this task was cancelled meanwhile)``.

        A commit that has started cannot be taken back (it may already be
        durable), so cancelling this task does not stop it: its answers are
        awaited anyway and handed to its waiters.
        """
        if in_loop:
            try:
                return self.store.append_many(requests), False
            except Exception as exc:
                return exc, False
        # A plain executor future, not a task: cancelling every task (as asyncio.run does on its way out) leaves it be.
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jixu-commit")
        running = asyncio.get_running_loop().run_in_executor(self._thread, self.store.append_many, requests)
        cancelled = False
        while True:
            try:
                return await asyncio.shield(running), cancelled
            except asyncio.CancelledError:
                if running.done():  # pragma: no cover - nothing here cancels it
                    raise
                cancelled = True
            except Exception as exc:
                return exc, cancelled


__all__ = ["Commitment", "Commits"]
