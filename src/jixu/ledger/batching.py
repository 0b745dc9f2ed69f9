"""Group commit for the tasks of one asyncio event loop.

A store's ``append`` is synchronous: called from a coroutine, it holds the
whole event loop until its commit is durable, so threads that share a loop
never share a commit. :class:`CommitBatcher` lets them: every coroutine that
appends waits on a future, and one commit at a time runs, carrying every
append that arrived while the previous one was running, through
:meth:`Store.append_many` (SQLite: one transaction, one fsync).

A commit runs in a worker thread, so that the loop keeps running its other
threads meanwhile, unless every running user of the batcher (a thread's
agent loop) waits for this very commit: then none of them could run during
it, and it runs in the loop's own thread, as a direct append does, without
the hand-offs of the worker thread and the interpreter lock (decision 0021).
A commit that no running user waits for (turns starting) runs in the worker.

Each waiter gets exactly what ``append`` would have given it: its stored
events once they are durable, or its own error. A waiter cancelled while its
commit runs does not cancel the commit (it may already be durable): its
future cannot be cancelled, so the waiter's cancellation arrives once the
commit's verdict is in (see :class:`Commitment`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from jixu.errors import JixuError, StoreError
from jixu.ledger.event import Event, NewEvent, PreparedEvent
from jixu.ledger.store import AppendRequest, Fence, Store


class Commitment(asyncio.Future[list[Event]]):
    """The answer to one queued append: a future that :meth:`cancel` leaves alone.

    Its append may already be durable, so no one may take it back. A task
    cancelled while it awaits one is told so (``CancelledError`` at its
    ``await``) when the commit's verdict is in, and can still read that
    verdict from the future. Cheaper than ``asyncio.shield``: no second
    future and no extra callback round on the event loop per append.
    """

    def cancel(self, msg: object = None) -> bool:
        """Refuse: the append may already be durable (returns False, changes nothing)."""
        return False

    def abandon(self) -> None:
        """Cancel it for real: only for an append that was never started (nothing of it was written)."""
        super().cancel()


class CommitBatcher:
    """Appends of one event loop's tasks, committed together (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._waiting: list[tuple[AppendRequest, Commitment, bool]] = []
        self._committing = False
        self._task: asyncio.Task[None] | None = None
        self.running = 0
        """How many of its users are running now (kept by them: a thread's agent loop counts itself)."""
        self.commits = 0
        """Commits made (each carried one or more appends)."""
        self.commits_in_loop = 0
        """Of :attr:`commits`, those made in the loop's own thread (every running user waited for it)."""
        self.appends = 0
        """Appends committed (or refused) through this batcher."""

    async def append(self, stream: str, events: Sequence[NewEvent | PreparedEvent], expected_seq: int,
                     fence: Fence | None = None) -> list[Event]:
        """:meth:`Store.append`, sharing its commit with the appends of other tasks of this loop.

        Cancelled while its commit runs, the caller gets ``CancelledError`` once the commit is over.
        """
        return await self.submit(stream, events, expected_seq, fence)

    def submit(self, stream: str, events: Sequence[NewEvent | PreparedEvent], expected_seq: int,
               fence: Fence | None = None, *, by_running_user: bool = False) -> Commitment:
        """Queue an append for the next commit; the future gets what :meth:`Store.append` would give.

        The future cannot be cancelled (see :class:`Commitment`): the append
        is in its commit whatever happens to the task that awaits it.
        ``by_running_user``: the caller is one of the :attr:`running` users
        and waits for this append (see the module docstring).
        """
        loop = asyncio.get_running_loop()
        future = Commitment(loop=loop)
        self._waiting.append((AppendRequest(stream, events, expected_seq, fence), future, by_running_user))
        if not self._committing:
            self._committing = True
            # Kept referenced: the loop holds tasks only weakly.
            self._task = loop.create_task(self._commit_all(), name="jixu-commit-batcher")
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
                # Any running user not in this commit may have work to do while it runs: a worker thread then.
                # So does a commit of no running user (turns starting): the loop may serve anything meanwhile.
                users = sum(1 for _request, _future, by_running_user in batch if by_running_user)
                in_loop = 0 < users >= self.running
                try:
                    answers, cancelled = await self._commit([request for request, _future, _user in batch], in_loop)
                except BaseException as interrupted:
                    # KeyboardInterrupt or SystemExit out of a commit made in the loop's thread: it goes on up, but
                    # no waiter of this commit may be left waiting forever (asyncio.run would hang cancelling it).
                    unknown = StoreError(f"{self.store.url}: the shared commit was interrupted "
                                         f"({type(interrupted).__name__}); whether it is durable is not known")
                    for _request, future, _user in batch:
                        if not future.done():
                            future.set_exception(unknown)
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
                for (_request, future, _user), result in zip(batch, results, strict=True):
                    if future.done():
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
                if cancelled:
                    # The loop is shutting down (its tasks are cancelled): appends still queued were never
                    # started, so nothing of them was written; their waiters are told so by cancellation.
                    waiting, self._waiting = self._waiting, []
                    for _request, future, _user in waiting:
                        future.abandon()
                    raise asyncio.CancelledError
        finally:
            self._committing = False

    async def _commit(self, requests: list[AppendRequest], in_loop: bool,
                      ) -> tuple[list[list[Event] | JixuError] | Exception, bool]:
        """Run one shared commit, in the loop's thread or a worker thread: ``(its answers or its error, whether
        this task was cancelled meanwhile)``.

        A commit that has started cannot be taken back (it may already be
        durable), so cancelling this task does not stop it: its answers are
        awaited anyway and handed to its waiters (a waiter cancelled together
        with this task waits for them, and would otherwise wait forever).
        """
        if in_loop:
            try:
                return self.store.append_many(requests), False
            except Exception as exc:
                return exc, False
        # A plain executor future, not a task: cancelling every task (as asyncio.run does on its way out) leaves it be.
        running = asyncio.get_running_loop().run_in_executor(None, self.store.append_many, requests)
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


__all__ = ["CommitBatcher", "Commitment"]
