"""A store grows a short WAL before its first append, so durable commits stop extending the file (0018).

Growing the file is an optimization only: it must leave no trace a reader
could see (``user_version``, the connection's settings, the events), give up
at once when another writer holds the lock, and a SIGKILL in the middle of it
must lose nothing.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from jixu.ledger import NewEvent
from jixu.ledger.sqlite import _WAL_FRAMES, SQLiteStore
from tests.helpers import spawn_python


def _event(i: int) -> NewEvent:
    return NewEvent("test.appended", {"i": i, "pad": "x" * 300})


def _wal(path: Path) -> int:
    return os.path.getsize(f"{path}-wal")


def _settings(store: SQLiteStore) -> tuple[int, int, int, int]:
    conn = store._conn
    return tuple(int(conn.execute(f"PRAGMA {name}").fetchone()[0])  # type: ignore[return-value]
                 for name in ("synchronous", "wal_autocheckpoint", "busy_timeout", "user_version"))


def test_the_first_append_grows_the_wal_and_later_commits_overwrite_it(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    store = SQLiteStore(path, busy_timeout=7.0)
    settings = _settings(store)
    assert _wal(path) < 100_000
    store.append("s/0", [_event(0)], 0)
    grown = _wal(path)
    assert grown >= _WAL_FRAMES * (4096 + 24)
    for i in range(1, 200):
        store.append("s/0", [_event(i)], i)
    assert _wal(path) == grown, "the log restarted at its start: no commit extended the file"
    assert _settings(store) == settings == (2, 1000, 7000, 0)
    assert [e.data["i"] for e in store.read("s/0")] == list(range(200))
    assert store.verify("s/0").valid
    store.close()


def test_a_store_reopened_grows_the_new_wal_again_and_a_long_one_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with SQLiteStore(path) as store:
        store.append("s/0", [_event(0)], 0)
    assert not os.path.exists(f"{path}-wal"), "the last connection's close removes the WAL"
    first = SQLiteStore(path)
    first.append("s/0", [_event(1)], 1)
    assert _wal(path) >= _WAL_FRAMES * (4096 + 24)
    # A second store on the file while the first keeps it open: the WAL is long already.
    second = SQLiteStore(path)
    statements: list[str] = []
    second._conn.set_trace_callback(statements.append)
    second.append("s/0", [_event(2)], 2)
    assert not [s for s in statements if "user_version" in s]
    assert [e.data["i"] for e in second.read("s/0")] == [0, 1, 2]
    second.close()
    first.close()


def test_growing_gives_up_at_once_while_another_writer_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    SQLiteStore(path).close()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    store = SQLiteStore(path, busy_timeout=10.0)
    settings = _settings(store)
    done: list[float] = []

    def append() -> None:
        started = time.monotonic()
        store.append("s/0", [_event(0)], 0)
        done.append(time.monotonic() - started)

    worker = threading.Thread(target=append)
    worker.start()
    time.sleep(0.4)
    assert not done, "the append waits for the lock (its own busy timeout), not the growth"
    other.execute("COMMIT")
    worker.join(10)
    assert done and done[0] < 5
    assert _settings(store) == settings
    assert [e.data["i"] for e in store.read("s/0")] == [0]
    assert _wal(path) < _WAL_FRAMES * (4096 + 24), "it did not grow under another writer's lock"
    other.close()
    store.close()


def test_a_writer_taking_the_lock_midway_stops_the_growth_and_nothing_is_left_changed(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    SQLiteStore(path).close()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    store = SQLiteStore(path)
    settings = _settings(store)
    starts: list[str] = []

    def trace(statement: str) -> None:
        if statement == "BEGIN IMMEDIATE":
            starts.append(statement)
            if len(starts) == 50:  # between two of the growth's transactions: take the lock now
                other.execute("BEGIN IMMEDIATE")
                other.execute("PRAGMA user_version = 7")  # the other writer's own change, kept
                threading.Timer(0.3, other.execute, ("COMMIT",)).start()

    store._conn.set_trace_callback(trace)
    store.append("s/0", [_event(0)], 0)
    store._conn.set_trace_callback(None)
    assert len(starts) == 51, "the 50th transaction found the lock taken and the growth stopped; the append waited"
    assert _settings(store) == (*settings[:3], 7), "settings restored; the other writer's user_version kept"
    assert _wal(path) < _WAL_FRAMES * (4096 + 24)
    assert [e.data["i"] for e in store.read("s/0")] == [0]
    other.close()
    store.close()


GROW_AND_DIE = """
import os, signal, sys
from jixu.ledger import NewEvent
from jixu.ledger.sqlite import SQLiteStore

store = SQLiteStore(sys.argv[1])
seen = []

def trace(statement):
    if statement.startswith(sys.argv[2]):
        seen.append(statement)
        if len(seen) == 500:  # halfway through the growth (the first statement of its kind is no growth)
            os.kill(os.getpid(), signal.SIGKILL)

store._conn.set_trace_callback(trace)
store.append("s/0", [NewEvent("test.appended", {"i": 3})], 3)
print("not killed", flush=True)
"""


@pytest.mark.parametrize("killed_at", ["PRAGMA user_version = 2", "COMMIT", "BEGIN IMMEDIATE"],
                         ids=["user_version_changed", "before_commit", "between_transactions"])
def test_a_sigkill_while_growing_loses_nothing_and_changes_nothing(tmp_path: Path, killed_at: str) -> None:
    path = tmp_path / "w.db"
    with SQLiteStore(path) as store:
        for i in range(3):
            store.append("s/0", [_event(i)], i)
        store._conn.execute("PRAGMA user_version = 2")
    child = spawn_python(GROW_AND_DIE, str(path), killed_at)
    out, _err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, out
    with SQLiteStore(path) as store:
        assert int(store._conn.execute("PRAGMA user_version").fetchone()[0]) == 2
        assert [e.data["i"] for e in store.read("s/0")] == [0, 1, 2]
        assert store.verify("s/0").valid
        store.append("s/0", [_event(3)], 3)
        assert [e.data["i"] for e in store.read("s/0")] == [0, 1, 2, 3]
