"""``Commits``: the one commit path of a store on an event loop; the appends of its tasks committed together.

Each waiter gets exactly what ``Store.append`` would have given it, and a
waiter that stops waiting does not take its append out of the commit. A
running user alone commits at once, without yielding.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import ConcurrencyError
from jixu.kernel.commits import Commits
from jixu.ledger import NewEvent
from jixu.ledger.sqlite import SQLiteStore
from jixu.ledger.store import AppendRequest
from tests.helpers import SlowCommits, spawn_python


def _event(i: int) -> NewEvent:
    return NewEvent("test.appended", {"i": i})


def test_appends_submitted_together_share_one_commit_and_get_their_own_answers(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "b.db")
    store.append("s/0", [_event(0)], 0)

    async def scenario() -> None:
        commits = Commits(store)
        first = commits.submit("s/0", [_event(1)], 1)
        refused = commits.submit("s/0", [_event(2)], 0)  # stale expected seq: refused alone
        fresh = commits.submit("s/1", [_event(3), _event(4)], 0)
        stored = await asyncio.shield(first)
        assert [(e.stream, e.seq, e.data) for e in stored] == [("s/0", 2, {"i": 1})]
        with pytest.raises(ConcurrencyError):
            await refused
        assert [e.seq for e in await commits.append("s/1", [_event(5)], 2)] == [3]
        assert [e.seq for e in await fresh] == [1, 2]
        assert (commits.commits, commits.appends) == (2, 4)

    commits = store.commit_count
    asyncio.run(scenario())
    assert store.commit_count - commits == 2
    assert [e.data["i"] for e in store.read("s/0")] == [0, 1]
    assert [e.data["i"] for e in store.read("s/1")] == [3, 4, 5]
    store.close()


def test_a_running_user_alone_commits_at_once_without_yielding_and_otherwise_shares(tmp_path: Path) -> None:
    """The only running user, nothing queued: the append is made in the caller (no other task runs before it
    returns). With a second user running, the same append is queued and shared, and the loop runs meanwhile."""
    store = SQLiteStore(tmp_path / "b.db")

    async def scenario() -> None:
        commits = Commits(store)
        ran: list[str] = []

        async def bystander() -> None:
            ran.append("bystander")

        with commits.user():
            assert commits.alone()
            other = asyncio.ensure_future(bystander())
            stored = await commits.append("s/0", [_event(1)], 0, user=True)
            assert ran == [], "the loop ran another task during an append made at once"
            assert [e.seq for e in stored] == [1]
            assert (commits.commits, commits.commits_at_once) == (1, 1)
            await other
            with commits.user():  # a second user is running: nothing is made at once any more
                assert not commits.alone()
                ran.clear()
                again = asyncio.ensure_future(bystander())
                stored = await commits.append("s/0", [_event(2)], 1, user=True)
                assert ran == ["bystander"], "the loop did not run its other tasks while the commit ran"
                await again
            assert [e.seq for e in stored] == [2]
            assert (commits.commits, commits.commits_at_once) == (2, 1)

    asyncio.run(scenario())
    assert [e.data["i"] for e in store.read("s/0")] == [1, 2]
    store.close()


def test_commits_of_a_store_is_one_per_event_loop(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "b.db")

    async def twice() -> tuple[Commits, Commits]:
        return Commits.of(store), Commits.of(store)

    first, again = asyncio.run(twice())
    assert first is again
    other, _ = asyncio.run(twice())
    assert other is not first, "another event loop shares nothing with the first"
    store.close()


def test_a_waiter_that_stops_waiting_does_not_take_its_append_out_of_the_commit(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "b.db")

    async def scenario() -> None:
        commits = Commits(store)
        future = commits.submit("s/0", [_event(1)], 0)
        waiter = asyncio.ensure_future(asyncio.shield(future))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert [e.seq for e in await asyncio.shield(future)] == [1]  # committed all the same

    asyncio.run(scenario())
    assert [e.data["i"] for e in store.read("s/0")] == [1]
    store.close()


def test_a_task_cancelled_during_its_commit_is_told_once_the_verdict_is_in(tmp_path: Path) -> None:
    """The submitted future cannot be cancelled: the task awaiting it gets CancelledError only when the commit
    is over, and can still read what was stored."""
    store = SlowCommits(tmp_path / "b.db")

    async def scenario() -> None:
        commits = Commits(store)
        commits.running = 1  # a user that could run meanwhile: the commit runs in a worker thread
        future = commits.submit("s/0", [_event(1)], 0)
        done_when_told: list[bool] = []

        async def waiter() -> None:
            try:
                await future
            except asyncio.CancelledError:
                done_when_told.append(future.done())
                raise

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0.05)  # the commit runs in its worker thread now
        assert future.cancel() is False and not future.cancelled()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert done_when_told == [True]
        assert [e.seq for e in future.result()] == [1]
        assert (commits.commits, commits.commits_in_loop) == (1, 0)

    asyncio.run(scenario())
    assert [e.data["i"] for e in store.read("s/0")] == [1]
    store.close()


class _WhereCommits(SQLiteStore):
    """Records the OS thread each shared commit ran in."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.ran_in: list[int] = []

    def append_many(self, requests: Sequence[AppendRequest]) -> list[Any]:
        self.ran_in.append(threading.get_ident())
        return super().append_many(requests)


@pytest.mark.parametrize(("running", "users_in_it", "in_loop"), [
    (0, [False, False], False),  # no running user waits (turns starting): the loop may serve anything meanwhile
    (2, [True, True], True),  # every running user waits for this commit
    (2, [True, False], False),  # one running user is not in it: it may have work to do meanwhile
    (3, [True, True], False),
], ids=["none_running", "all_running_in_it", "one_running_outside", "one_of_three_outside"])
def test_a_commit_runs_in_the_loop_only_when_every_running_user_waits_for_it(
        tmp_path: Path, running: int, users_in_it: list[bool], in_loop: bool) -> None:
    store = _WhereCommits(tmp_path / "b.db")

    async def scenario() -> None:
        commits = Commits(store)
        commits.running = running
        futures = [commits.submit(f"s/{i}", [_event(i)], 0, user=is_user)
                   for i, is_user in enumerate(users_in_it)]
        answers = await asyncio.gather(*futures)
        assert [[e.seq for e in events] for events in answers] == [[1], [1]]
        assert (commits.commits, commits.commits_in_loop) == (1, int(in_loop))

    asyncio.run(scenario())
    assert (store.ran_in == [threading.get_ident()]) is in_loop, "the loop's thread is this one"
    assert len(store.ran_in) == 1
    store.close()


INTERRUPTED_IN_LOOP = """
import asyncio, sys
from jixu.ledger import NewEvent
from jixu.kernel.commits import Commits
from jixu.ledger.sqlite import SQLiteStore

class Interrupted(SQLiteStore):
    def append_many(self, requests):
        raise KeyboardInterrupt  # as a signal handler would raise it in the middle of the commit

commitments = []

async def main():
    commits = Commits(Interrupted(sys.argv[1]))
    commits.running = 2  # both appends are by running users: the commit runs in the loop's thread
    commitments.extend(commits.submit(f"s/{i}", [NewEvent("test.appended", {"i": i})], 0, user=True)
                       for i in range(2))
    await asyncio.gather(*commitments)

try:
    asyncio.run(main())
except KeyboardInterrupt:
    answers = [type(c.exception()).__name__ + ": " + str(c.exception()) for c in commitments if c.done()]
    print("interrupted;", len(answers), "answered;", " | ".join(answers), flush=True)
"""


def test_a_commit_in_the_loop_interrupted_by_keyboardinterrupt_answers_its_waiters_and_ends(tmp_path: Path) -> None:
    """KeyboardInterrupt (or SystemExit) out of a commit made in the loop's thread propagates, and every
    append of that commit is answered first (its outcome unknown): none is left waiting forever, which
    would hang ``asyncio.run`` while it cancels the remaining tasks on its way out."""
    child = spawn_python(INTERRUPTED_IN_LOOP, str(tmp_path / "k.db"))
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise AssertionError("the program hung after the interrupted commit") from None
    assert child.returncode == 0, err
    assert out.startswith("interrupted; 2 answered; StoreError: "), out
    assert out.count("was interrupted (KeyboardInterrupt); whether it is durable is not known") == 2, out


INTERRUPTED_IN_A_WORKER = """
import asyncio, sys, time
from jixu.kernel.commits import Commits
from jixu.ledger import NewEvent
from jixu.ledger.sqlite import SQLiteStore

class Interrupted(SQLiteStore):
    def append_many(self, requests):
        time.sleep(0.2)  # long enough for the second append to queue behind this commit
        raise KeyboardInterrupt

async def main():
    commits = Commits(Interrupted(sys.argv[1]))
    commits.running = 1  # a running user outside the commit: it runs in a worker thread
    first = commits.submit("s/0", [NewEvent("test.appended", {"i": 0})], 0)
    await asyncio.sleep(0.05)

    async def second() -> None:  # another task waits for the append queued behind the interrupted commit
        await commits.submit("s/1", [NewEvent("test.appended", {"i": 1})], 0)

    waiting = asyncio.ensure_future(second())
    await asyncio.sleep(0)
    await first
    await waiting

try:
    asyncio.run(main())
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_appends_queued_behind_an_interrupted_commit_are_abandoned_and_the_program_ends(tmp_path: Path) -> None:
    """The appends queued while the interrupted commit ran were never started: their waiters are told so
    (cancelled) instead of keeping ``asyncio.run`` waiting for them forever."""
    child = spawn_python(INTERRUPTED_IN_A_WORKER, str(tmp_path / "q.db"))
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise AssertionError("the program hung after the interrupted commit") from None
    assert child.returncode == 0, err
    assert out.strip() == "interrupted", (out, err)
    with SQLiteStore(tmp_path / "q.db") as store:
        assert store.read("s/1") == [], "the queued append was never written"


def test_a_commit_task_cancelled_before_it_starts_abandons_its_appends(tmp_path: Path) -> None:
    """``asyncio.run`` cancels every task on its way out, the commit task too, maybe before its first step: then
    none of the queued appends was started, and each waiter is told so (cancelled) instead of waiting forever;
    the commits commits later appends as before."""
    store = SQLiteStore(tmp_path / "b.db")

    async def scenario() -> None:
        commits = Commits(store)
        future = commits.submit("s/0", [_event(1)], 0)
        assert commits._task is not None
        commits._task.cancel()  # before the task has run at all
        done, _pending = await asyncio.wait({future}, timeout=2)
        assert future in done and future.cancelled(), "the waiter was left waiting"
        later = asyncio.ensure_future(commits.append("s/0", [_event(2)], 0))
        done, _pending = await asyncio.wait({later}, timeout=2)
        assert later in done, "the commits stayed stuck"
        assert [e.seq for e in later.result()] == [1]

    asyncio.run(scenario())
    assert [e.data["i"] for e in store.read("s/0")] == [2], "the abandoned append wrote nothing"
    store.close()


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "not-stored"])
def test_an_append_whose_commit_outcome_is_unknown_is_committed_again_until_the_store_answers(
        tmp_path: Path, stored: bool) -> None:
    """A running user alone commits at once; that commit's outcome is unknown (stored or not), then the store
    is unreachable once. The same append is committed again on the shared path: its events come back once,
    as stored, whichever way the first commit went."""
    from jixu.errors import OutcomeUnknown, StoreError

    failures = ["unknown", "unreachable"]

    class Restarting(SQLiteStore):
        def append(self, stream: str, events: Any, expected_seq: int, fence: Any = None, **kw: Any) -> Any:
            if failures and failures[0] == "unknown":
                failures.pop(0)
                if stored:
                    super().append(stream, events, expected_seq, fence, **kw)
                raise OutcomeUnknown("the connection broke before this write was answered")
            return super().append(stream, events, expected_seq, fence, **kw)

        def append_many(self, requests: Sequence[AppendRequest]) -> Any:
            if failures:
                failures.pop(0)
                raise StoreError("cannot connect: the server is restarting")
            return super().append_many(requests)

    store = Restarting(tmp_path / "b.db")

    async def scenario() -> None:
        commits = Commits(store)
        with commits.user():
            stored_events = await commits.append("s/0", [_event(1)], 0, user=True)
        assert [(e.seq, e.data) for e in stored_events] == [(1, {"i": 1})]

    asyncio.run(scenario())
    assert failures == [] and [e.data for e in store.read("s/0")] == [{"i": 1}]
    store.close()
