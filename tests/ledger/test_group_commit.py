"""Group commit in the SQLite store: concurrent appends share a commit, never their fate.

Appends made at the same time by threads of one process run in one
transaction (one fsync), each inside its own savepoint. These tests pin the
contract that must survive the sharing: every call is atomic and gets its
own result or error, nothing is lost or duplicated under many appenders, and
an append that returned is durable even if the process is SIGKILLed at once.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import ConcurrencyError, FencingError, IdempotencyConflict, StoreError
from jixu.ledger import Event, Fence, NewEvent, new_id
from jixu.ledger.sqlite import SQLiteStore
from tests.helpers import spawn_python


def _event(tag: str, i: int = 0) -> NewEvent:
    return NewEvent("test.appended", {"tag": tag, "i": i})


class _Outcome:
    def __init__(self) -> None:
        self.rows: list[Event] | None = None
        self.error: BaseException | None = None


def _in_one_group(store: SQLiteStore, calls: list[Callable[[], Any]]) -> list[_Outcome]:
    """Run ``calls`` on threads so that all of them are queued before any commits: one group, in order."""
    outcomes = [_Outcome() for _ in calls]
    threads = []

    def run(call: Callable[[], Any], outcome: _Outcome) -> None:
        try:
            outcome.rows = call()
        except Exception as exc:
            outcome.error = exc

    with store._lock:  # hold the connection: every append queues behind it
        for number, (call, outcome) in enumerate(zip(calls, outcomes, strict=True), start=1):
            thread = threading.Thread(target=run, args=(call, outcome))
            thread.start()
            threads.append(thread)
            deadline = time.monotonic() + 10
            while len(store._queue) < number:  # queue them in a known order
                assert thread.is_alive(), f"call {number} ended before queueing: {outcome.error!r}"
                assert time.monotonic() < deadline, "an append never reached the queue"
                time.sleep(0.001)
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    return outcomes


def test_one_group_one_commit_and_each_call_keeps_its_own_result(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "group.db")
    store.append("shared/1", [_event("first")], 0)
    stale = store.acquire_lease("turn/1", "owner-a", 30)
    store.release_lease(stale)
    taken = store.acquire_lease("turn/1", "owner-b", 30)
    assert isinstance(taken, Fence) and taken.epoch == stale.epoch + 1
    clash = NewEvent("test.appended", {"tag": "original"}, id=new_id())
    store.append("other/1", [clash], 0)
    commits, appends = store.commit_count, store.append_count

    outcomes = _in_one_group(store, [
        lambda: store.append("a/1", [_event("a", 1), _event("a", 2), _event("a", 3)], 0),
        lambda: store.append("shared/1", [_event("winner")], 1),
        lambda: store.append("shared/1", [_event("loser")], 1),           # head moved by the call before it
        lambda: store.append("b/1", [_event("fenced-out")], 0, stale),    # stale fence
        lambda: store.append("b/2", [_event("fenced-in")], 0, taken),
        lambda: store.append("c/1", [_event("c"), NewEvent("test.appended", {"tag": "changed"}, id=clash.id)], 0),
        lambda: store.append("shared/1", [_event("second")], 2),          # sees the winner's head
    ])

    assert (store.commit_count, store.append_count) == (commits + 1, appends + 7)
    a, winner, loser, fenced_out, fenced_in, conflict, second = outcomes
    assert a.error is None and a.rows is not None and [r.seq for r in a.rows] == [1, 2, 3]
    assert winner.error is None and winner.rows is not None and winner.rows[0].seq == 2
    assert isinstance(loser.error, ConcurrencyError) and loser.rows is None
    assert isinstance(fenced_out.error, FencingError)
    assert fenced_in.error is None
    assert isinstance(conflict.error, IdempotencyConflict)
    assert second.error is None and second.rows is not None and second.rows[0].seq == 3
    # Refused calls stored nothing at all (their batches were undone whole); the others all of theirs.
    assert store.stream_info("b/1") is None and store.stream_info("c/1") is None
    assert [e.data["tag"] for e in store.read("shared/1")] == ["first", "winner", "second"]
    assert [e.data["tag"] for e in store.read("a/1")] == ["a", "a", "a"]
    assert store.get_event(clash.id) is not None and store.get_event(clash.id).stream == "other/1"  # type: ignore[union-attr]
    for stream in ("a/1", "shared/1", "b/2", "other/1"):
        assert store.verify(stream).valid
    store.close()


class _FailingInserts:
    """The store's connection, except that inserting into one stream writes the rows and then fails."""

    def __init__(self, real: sqlite3.Connection, stream: str) -> None:
        self._real = real
        self._stream = stream

    def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> sqlite3.Cursor:
        cursor = self._real.executemany(sql, rows)
        if any(row[1] == self._stream for row in rows):
            raise sqlite3.OperationalError("injected failure after the rows were inserted")
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_call_failing_mid_insert_is_undone_alone(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "group.db")
    real = store._conn
    store._conn = _FailingInserts(real, "bad/1")  # type: ignore[assignment]
    outcomes = _in_one_group(store, [
        lambda: store.append("good/1", [_event("g", 1), _event("g", 2)], 0),
        lambda: store.append("bad/1", [_event("x", 1), _event("x", 2)], 0),
        lambda: store.append("good/2", [_event("h", 1)], 0),
    ])
    store._conn = real
    good, bad, good2 = outcomes
    assert good.error is None and good2.error is None
    assert isinstance(bad.error, StoreError) and "injected" in str(bad.error)
    assert store.stream_info("bad/1") is None
    conn = sqlite3.connect(tmp_path / "group.db")
    try:
        assert conn.execute("SELECT count(*) FROM jixu_events WHERE stream = 'bad/1'").fetchone()[0] == 0
    finally:
        conn.close()
    assert [e.seq for e in store.read("good/1")] == [1, 2] and store.verify("good/1").valid
    assert [e.seq for e in store.read("good/2")] == [1]
    store.close()


def test_a_failed_shared_commit_fails_every_call_in_the_group(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "group.db")
    real = store._conn

    class FailingCommit(_FailingInserts):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error (injected)")
            return self._real.execute(sql, *args)

    store._conn = FailingCommit(real, "-")  # type: ignore[assignment]
    outcomes = _in_one_group(store, [lambda: store.append("x/1", [_event("x")], 0),
                                     lambda: store.append("x/2", [_event("y")], 0)])
    store._conn = real
    if real.in_transaction:  # the injected COMMIT failure left the transaction to the caller's rollback
        real.execute("ROLLBACK")
    assert all(isinstance(o.error, StoreError) and o.rows is None for o in outcomes)
    assert store.stream_info("x/1") is None and store.stream_info("x/2") is None
    assert store.append("x/1", [_event("x")], 0)[0].seq == 1  # the store still works
    store.close()


def test_many_concurrent_appenders_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "many.db")
    workers, rounds = 24, 30
    returned: dict[str, list[Event]] = {}
    shared: list[Event] = []
    lock = threading.Lock()
    failures: list[BaseException] = []
    start = threading.Barrier(workers)

    def work(n: int) -> None:
        rng = random.Random(n)
        own = f"own/{n}"
        mine: list[Event] = []
        try:
            start.wait()
            for i in range(rounds):
                size = rng.randint(1, 3)
                mine += store.append(own, [_event(own, i * 10 + k) for k in range(size)], len(mine))
                while True:  # contend on one stream: read the head, retry on conflict
                    info = store.stream_info("shared/1")
                    try:
                        rows = store.append("shared/1", [_event(own, i)], info.head_seq if info else 0)
                    except ConcurrencyError:
                        continue
                    with lock:
                        shared.extend(rows)
                    break
        except BaseException as exc:
            failures.append(exc)
        with lock:
            returned[own] = mine

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures[:3]
    assert store.commit_count < store.append_count, "no two appends ever shared a commit"
    for stream, rows in returned.items():
        stored = list(store.read_rows(stream))
        assert [(r.id, r.seq, r.hash) for r in stored] == [(r.id, r.seq, r.hash) for r in rows]
        assert store.verify(stream).valid
    stored_shared = list(store.read_rows("shared/1"))
    assert len(stored_shared) == workers * rounds
    assert sorted((r.id, r.seq, r.hash) for r in stored_shared) == sorted((r.id, r.seq, r.hash) for r in shared)
    assert [r.seq for r in stored_shared] == list(range(1, workers * rounds + 1))
    assert store.verify("shared/1").valid
    conn = sqlite3.connect(tmp_path / "many.db")
    try:
        total, distinct = conn.execute("SELECT count(*), count(DISTINCT id) FROM jixu_events").fetchone()
    finally:
        conn.close()
    assert total == distinct == sum(len(r) for r in returned.values()) + workers * rounds
    store.close()


KILL_CHILD = r"""
import sys, threading
from jixu.ledger.event import NewEvent
from jixu.ledger.sqlite import SQLiteStore

path, workers = sys.argv[1], int(sys.argv[2])
store = SQLiteStore(path, synchronous="FULL")
out = threading.Lock()
heads = {}
for n in range(workers):
    info = store.stream_info(f"kill/{n}")
    heads[n] = info.head_seq if info else 0

def work(n):
    stream, head = f"kill/{n}", heads[n]
    while True:
        [row] = store.append(stream, [NewEvent("test.appended", {"n": n, "seq": head + 1, "pad": "x" * 300})], head)
        head = row.seq
        with out:
            print("ok", stream, row.seq, row.id, row.hash, store.commit_count, store.append_count, flush=True)

with out:  # under the lock the workers print with: a line of theirs must not run into this one
    print("ready", flush=True)
for n in range(workers):
    threading.Thread(target=work, args=(n,), daemon=True).start()
threading.Event().wait()
"""


@pytest.mark.crash
def test_every_append_that_returned_survives_a_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "kill.db"
    workers = 8
    rng = random.Random(20260110)
    reported: dict[tuple[str, int], tuple[str, str]] = {}
    shared_commits = False
    for _cycle in range(6):
        proc = spawn_python(KILL_CHILD, str(path), str(workers))
        lines: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None

        def read(stream: Any = proc.stdout, sink: queue.Queue[str | None] = lines) -> None:
            for line in stream:
                sink.put(line.rstrip("\n"))
            sink.put(None)

        threading.Thread(target=read, daemon=True).start()
        seen = 0
        cycle_lines: list[str] = []
        try:
            target = rng.randint(50, 400)
            while seen < target:
                line = lines.get(timeout=30)
                assert line is not None, proc.stderr.read() if proc.stderr else ""
                cycle_lines.append(line)
                seen += line.startswith("ok ")
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        assert proc.returncode == -signal.SIGKILL
        while (line := lines.get(timeout=30)) is not None:
            cycle_lines.append(line)
        if proc.stderr is not None:
            proc.stderr.close()
        for line in cycle_lines:
            fields = line.split()
            if fields[:1] == ["ok"] and len(fields) == 7:  # a line cut short by the kill proves nothing
                reported[(fields[1], int(fields[2]))] = (fields[3], fields[4])
                shared_commits = shared_commits or int(fields[5]) < int(fields[6])
        with SQLiteStore(path) as store:
            for (stream, seq), (event_id, digest) in reported.items():
                row = store.get_event(event_id)
                assert row is not None, f"append {stream}@{seq} returned but is not on disk"
                assert (row.stream, row.seq, row.hash) == (stream, seq, digest)
            for n in range(workers):
                info = store.stream_info(f"kill/{n}")
                if info is not None:
                    report = store.verify(f"kill/{n}")
                    assert report.valid and report.count == info.head_seq, report
    assert len(reported) >= 6 * 50
    assert shared_commits, "the children never shared a commit: this test did not exercise group commit"


def test_append_many_is_one_commit_and_a_closed_store_answers_each_append_with_an_error(tmp_path: Path) -> None:
    from jixu.errors import JixuError
    from jixu.ledger.store import AppendRequest

    store = SQLiteStore(tmp_path / "many.db")
    commits, appends = store.commit_count, store.append_count
    answers = store.append_many([AppendRequest(f"many/{n}", [_event("m", n)], 0) for n in range(5)])
    assert all(isinstance(answer, list) and answer[0].seq == 1 for answer in answers)
    assert (store.commit_count, store.append_count) == (commits + 1, appends + 5)
    store.close()
    refused = store.append_many([AppendRequest("many/0", [_event("m", 9)], 1),
                                 AppendRequest("many/9", [_event("m", 10)], 0)])
    assert len(refused) == 2 and all(isinstance(answer, StoreError) for answer in refused)
    assert all(isinstance(answer, JixuError) for answer in refused)


def test_appends_that_queue_work_share_a_group_and_each_keeps_both_or_neither(tmp_path: Path) -> None:
    # What the API's sync endpoints do at once (POST /threads/{id}/inputs, one thread each): one commit for
    # all of them; an append refused inside the group writes neither its events nor its queue row.
    store = SQLiteStore(tmp_path / "queued.db")
    for name in ("a", "b", "c"):
        store.append(f"thread/{name}", [_event(f"created {name}")], 0)
    commits = store.commit_count

    def enqueue(name: str, expected: int) -> Callable[[], Any]:
        return lambda: store.append_and_enqueue(f"thread/{name}", [_event(f"turn {name}")], expected,
                                                key=f"thread/{name}", group="p")

    outcomes = _in_one_group(store, [enqueue("a", 1), enqueue("b", 7), enqueue("c", 1),
                                     lambda: store.append("plain/1", [_event("plain")], 0)])
    assert store.commit_count == commits + 1, "one transaction for the whole group"
    assert [type(outcome.error) for outcome in outcomes] == [type(None), ConcurrencyError, type(None), type(None)]
    assert [e.data["tag"] for e in store.read("thread/a")] == ["created a", "turn a"]
    assert [e.data["tag"] for e in store.read("thread/b")] == ["created b"]
    queued = {item.key for item in store.list_work(state="pending")}
    assert queued == {"thread/a", "thread/c"}, "the refused append queued nothing"
    store.close()
