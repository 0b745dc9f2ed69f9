"""The batched path of SQLite group commit: the answers of one by one, in a few statements.

A group of several appends is checked with a few reads for all of them and
written with one ``executemany`` per table, without savepoints. Every test
here runs the same appends a second time, one ``append`` at a time, on a
store set up the same way, and asks for the same answers (rows, or errors of
the same type, message and details) and the same stored streams. The time
the stores stamp is frozen, so even the hashes of the two stores agree.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import jixu.ledger.sqlite as sqlite_module
from jixu.errors import ConcurrencyError, FencingError, IdempotencyConflict, JixuError
from jixu.ledger import Event, Fence, NewEvent, new_id
from jixu.ledger.sqlite import SQLiteStore
from jixu.ledger.store import AppendRequest
from tests.helpers import examples
from tests.ledger.test_group_commit import _in_one_group

FROZEN = "2026-11-30T10:00:00.000000Z"
FORK = "f" * 64


@pytest.fixture(autouse=True)
def _frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_module, "utc_now_text", lambda: FROZEN)


def _events(tag: str, n: int = 1) -> list[NewEvent]:
    return [NewEvent("test.appended", {"tag": tag, "i": i}, id=new_id()) for i in range(n)]


class _World:
    """Two stores with the same history: ``grouped`` gets the group, ``alone`` the same appends one by one."""

    def __init__(self, directory: Path) -> None:
        self.old1 = [_events("old1-a", 2), _events("old1-b", 1)]
        self.old2 = [_events("old2-a", 1)]
        self.old3 = [_events("old3-a", 3)]
        self.stores = [SQLiteStore(directory / "grouped.db", synchronous="NORMAL"),
                       SQLiteStore(directory / "alone.db", synchronous="NORMAL")]
        fences = []
        for store in self.stores:
            store.append("old/1", self.old1[0], 0)
            store.append("old/1", self.old1[1], 2)
            store.append("old/2", self.old2[0], 0)
            store.append("old/3", self.old3[0], 0)
            stale = store.acquire_lease("turn/1", "owner-a", 3600)
            store.release_lease(stale)
            fences.append((stale, store.acquire_lease("turn/1", "owner-b", 3600)))
        assert fences[0] == fences[1]  # same epochs: one fence object is good (or stale) in both stores
        self.stale, self.good = fences[0]
        self.missing = Fence("turn/none", "owner-a", 1)
        self.grouped, self.alone = self.stores

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[_World]:
    made = _World(tmp_path)
    yield made
    made.close()


def _one_by_one(store: SQLiteStore, requests: Sequence[AppendRequest]) -> list[list[Event] | JixuError]:
    answers: list[list[Event] | JixuError] = []
    for request in requests:
        try:
            answers.append(store.append(request.stream, request.events, request.expected_seq, request.fence))
        except JixuError as error:
            answers.append(error)
    return answers


def _answer(result: list[Event] | BaseException | None) -> Any:
    """What an append answered, comparable across stores: its events, or its error's type, message and details."""
    if isinstance(result, BaseException):
        details = result.details if isinstance(result, JixuError) else {}
        return ("error", type(result).__name__, str(result), details)
    return ("events", result)


def _contents(store: SQLiteStore) -> Any:
    """Every stream of ``store`` with its head row and all its rows."""
    infos = store.list_streams()
    return [(info, list(store.read_rows(info.stream))) for info in infos]


def _event_count(store: SQLiteStore) -> tuple[int, int]:
    conn = sqlite3.connect(store.path)
    try:
        total, distinct = conn.execute("SELECT count(*), count(DISTINCT id) FROM jixu_events").fetchone()
    finally:
        conn.close()
    return int(total), int(distinct)


def _assert_same(grouped: SQLiteStore, alone: SQLiteStore) -> None:
    assert _contents(grouped) == _contents(alone)
    assert _event_count(grouped) == _event_count(alone)
    total, distinct = _event_count(grouped)
    assert total == distinct
    for info in grouped.list_streams():
        assert grouped.verify(info.stream).valid


@contextmanager
def _traced(store: SQLiteStore) -> Iterator[list[str]]:
    """The statements ``store``'s connection runs meanwhile (an ``executemany`` shows once per row)."""
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        store._conn.set_trace_callback(None)


def _kinds(statements: list[str]) -> list[str]:
    return [statement.split()[0].upper() for statement in statements]


def test_a_mixed_group_answers_and_stores_as_one_by_one(world: _World) -> None:
    clash = NewEvent("test.appended", {"tag": "other content"}, id=world.old1[1][0].id)
    requests = [
        AppendRequest("old/1", _events("accepted", 2), 3),
        AppendRequest("old/2", _events("behind"), 0),                       # head is 1: ConcurrencyError
        AppendRequest("new/1", _events("stale"), 0, world.stale),           # FencingError (stale epoch)
        AppendRequest("new/2", _events("fenced", 3), 0, world.good),        # new stream, good fence
        AppendRequest("old/2", world.old2[0], 7),                           # a retry: the stored rows
        AppendRequest("new/3", [*_events("partly"), clash], 0),             # IdempotencyConflict
        AppendRequest("old/1", world.old1[0], 0, world.stale),              # a retry wins over a stale fence
        AppendRequest("new/4", _events("no lease"), 0, world.missing),      # FencingError (no lease)
        AppendRequest("old/2", _events("after the retry"), 1, world.good),  # existing stream, fenced
        AppendRequest("new/5", _events("fresh"), 0),
        AppendRequest("new/6", [*_events("two of three"), *world.old3[0][:2]], 0),  # names the first one found
    ]
    commits, appends = world.grouped.commit_count, world.grouped.append_count
    with _traced(world.grouped) as statements:
        grouped = world.grouped.append_many(requests)
    alone = _one_by_one(world.alone, requests)

    assert [_answer(answer) for answer in grouped] == [_answer(answer) for answer in alone]
    kinds = [type(answer).__name__ if isinstance(answer, BaseException) else "rows" for answer in grouped]
    assert kinds == ["rows", "ConcurrencyError", "FencingError", "rows", "rows", "IdempotencyConflict", "rows",
                     "FencingError", "rows", "rows", "IdempotencyConflict"]
    assert grouped[4] == world.grouped.read("old/2", 1, 1) and grouped[6] == world.grouped.read("old/1", 1, 2)
    assert (world.grouped.commit_count, world.grouped.append_count) == (commits + 1, appends + len(requests))
    assert "SAVEPOINT" not in _kinds(statements)
    _assert_same(world.grouped, world.alone)
    assert world.grouped.stream_info("new/1") is None and world.grouped.stream_info("new/3") is None


def test_appends_to_one_stream_in_one_group_see_each_other(world: _World) -> None:
    requests = [
        AppendRequest("old/1", _events("first", 2), 3),
        AppendRequest("old/1", _events("second"), 5),       # the first one's head
        AppendRequest("old/1", _events("stale"), 3),        # ConcurrencyError at seq 6
        AppendRequest("new/1", _events("opens"), 0),
        AppendRequest("new/1", _events("also opens"), 0),   # ConcurrencyError: the stream is at 1 now
        AppendRequest("new/1", _events("follows", 2), 1),
        AppendRequest("new/2", _events("fenced out"), 0, world.stale),
        AppendRequest("new/2", _events("opens after a refusal"), 0),
        AppendRequest("old/2", _events("behind"), 0),
        AppendRequest("old/2", _events("moves"), 1),
        AppendRequest("old/1", _events("third"), 6),
    ]
    with _traced(world.grouped) as statements:
        grouped = world.grouped.append_many(requests)
    alone = _one_by_one(world.alone, requests)

    assert [_answer(answer) for answer in grouped] == [_answer(answer) for answer in alone]
    stale = grouped[2]
    assert isinstance(stale, ConcurrencyError)
    assert stale.details == {"stream": "old/1", "expected_seq": 3, "actual_seq": 6}
    assert [e.seq for e in world.grouped.read("old/1")] == [1, 2, 3, 4, 5, 6, 7]
    assert [e.seq for e in world.grouped.read("new/1")] == [1, 2, 3]
    assert "SAVEPOINT" not in _kinds(statements)
    _assert_same(world.grouped, world.alone)


def test_new_streams_of_a_group_keep_the_genesis_their_first_append_gave(world: _World) -> None:
    store = world.grouped
    outcomes = _in_one_group(store, [
        lambda: store.append("fork/1", _events("forked"), 0, genesis_hash=FORK),
        lambda: store.append("fork/1", _events("next"), 1),
        lambda: store.append("fork/2", _events("refused"), 0, world.stale, genesis_hash="0" * 64),
        lambda: store.append("fork/2", _events("plain"), 0),
    ])
    assert [type(outcome.error) for outcome in outcomes] == [type(None), type(None), FencingError, type(None)]
    info1, info2 = store.stream_info("fork/1"), store.stream_info("fork/2")
    assert info1 is not None and info1.genesis_hash == FORK and info1.head_seq == 2
    assert info1.created_at == FROZEN
    assert info2 is not None and info2.genesis_hash == sqlite_module.GENESIS_HASH
    assert store.read("fork/1")[0].prev_hash == FORK
    assert store.verify("fork/1").valid and store.verify("fork/2").valid


def test_a_group_runs_a_few_statements_not_several_per_append(world: _World) -> None:
    for n in range(20):
        first = _events("first")
        for store in world.stores:
            store.append(f"many/{n}", first, 0)
    requests = [AppendRequest(f"many/{n}", _events("next"), 1, world.good) for n in range(20)]
    real = world.grouped._conn
    calls: list[str] = []

    class Counting:
        """The connection, counting the calls the store makes on it."""

        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            calls.append(sql)
            return real.execute(sql, *args)

        def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
            calls.append(sql)
            return real.executemany(sql, rows)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    world.grouped._conn = Counting()  # type: ignore[assignment]
    try:
        with _traced(world.grouped) as statements:
            grouped = world.grouped.append_many(requests)
    finally:
        world.grouped._conn = real
    assert all(isinstance(answer, list) for answer in grouped)
    assert [_answer(answer) for answer in grouped] == [_answer(answer) for answer in _one_by_one(world.alone, requests)]
    # BEGIN, heads, ids, leases, clock, the events, the heads, COMMIT: 8 calls (one by one: 5 per append).
    assert len(calls) <= 8, calls
    kinds = _kinds(statements)
    assert "SAVEPOINT" not in kinds and "RELEASE" not in kinds and "ROLLBACK" not in kinds
    assert kinds.count("SELECT") <= 4
    assert kinds.count("INSERT") == kinds.count("UPDATE") == 20  # one executemany each, traced once per row
    assert len(statements) < 20 * 4
    _assert_same(world.grouped, world.alone)


def test_the_in_lists_are_chunked(world: _World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_module, "_IN_CHUNK", 3)
    keys = []
    for n in range(4):
        first = _events("first")
        for store in world.stores:
            lease = store.acquire_lease(f"key/{n}", "owner", 3600)
            store.append(f"chunk/{n}", first, 0)
        keys.append(lease)
    requests = [AppendRequest(f"chunk/{n}", _events("next", 2), 1, keys[n]) for n in range(4)]
    requests += [AppendRequest(f"fresh/{n}", _events("new"), 0) for n in range(3)]
    requests += [AppendRequest("old/2", [*_events("partly"), *world.old2[0]], 1),
                 AppendRequest("chunk/0", _events("behind"), 1, keys[0])]
    with _traced(world.grouped) as statements:
        grouped = world.grouped.append_many(requests)
    assert [_answer(answer) for answer in grouped] == [_answer(answer) for answer in _one_by_one(world.alone, requests)]
    assert isinstance(grouped[-2], IdempotencyConflict) and isinstance(grouped[-1], ConcurrencyError)
    selects = [s for s in statements if s.startswith("SELECT")]
    # 8 streams, 14 ids and 4 lease keys, 3 to a statement; then the clock and the partly stored batch's rows.
    assert len(selects) == 3 + 5 + 2 + 1 + 1, selects
    assert "SAVEPOINT" not in _kinds(statements)
    _assert_same(world.grouped, world.alone)


def _fail_once_in(store: SQLiteStore, trigger: str, at_row: int = 2) -> list[int]:
    """Make ``trigger``'s statement fail once, at its ``at_row``-th row, with a real SQLite error."""
    calls = [0]

    def boom() -> int:
        calls[0] += 1
        return int(calls[0] == at_row)

    store._conn.create_function("jixu_test_boom", 0, boom)
    store._conn.execute(f"CREATE TEMP TRIGGER jixu_test_boom {trigger} WHEN jixu_test_boom() "
                        "BEGIN SELECT RAISE(ABORT, 'injected failure'); END")
    return calls


@pytest.mark.parametrize("trigger", [
    "BEFORE INSERT ON main.jixu_events",
    "BEFORE UPDATE ON main.jixu_streams",   # after every event row was inserted
    "BEFORE INSERT ON main.jixu_streams",
])
def test_a_failing_batched_write_falls_back_to_one_savepoint_per_append(world: _World, trigger: str) -> None:
    requests = [
        AppendRequest("old/1", _events("a", 2), 3),
        AppendRequest("old/2", _events("b"), 1),
        AppendRequest("new/1", _events("c"), 0),
        AppendRequest("old/1", _events("late"), 3),       # ConcurrencyError either way
        AppendRequest("new/2", _events("d", 2), 0, world.good),
        AppendRequest("old/2", world.old2[0], 0),         # a retry
        AppendRequest("new/1", _events("e"), 1),
    ]
    calls = _fail_once_in(world.grouped, trigger)
    commits = world.grouped.commit_count
    with _traced(world.grouped) as statements:
        grouped = world.grouped.append_many(requests)
    alone = _one_by_one(world.alone, requests)

    assert calls[0] > 2, "the injected failure never fired"
    assert [_answer(answer) for answer in grouped] == [_answer(answer) for answer in alone]
    assert [isinstance(answer, list) for answer in grouped] == [True, True, True, False, True, True, True]
    kinds = _kinds(statements)
    assert "ROLLBACK" in kinds and kinds.count("SAVEPOINT") == len(requests)  # undone, then one by one
    assert kinds.index("ROLLBACK") < kinds.index("SAVEPOINT")
    assert world.grouped.commit_count == commits + 1
    _assert_same(world.grouped, world.alone)


@pytest.mark.parametrize("clash", [False, True])
def test_an_id_in_two_appends_of_a_group_takes_the_savepoint_path(world: _World, clash: bool) -> None:
    repeated = _events("repeated", 2)
    requests = [
        AppendRequest("dup/1", repeated, 0),
        AppendRequest("dup/1", repeated, 0),      # the first one's rows, as a retry
        AppendRequest("old/1", _events("x"), 3),
    ]
    if clash:  # IdempotencyConflict: stored by the first one
        requests.append(AppendRequest("dup/2", [NewEvent("test.appended", {"tag": "other"}, id=repeated[0].id)], 0))
    with _traced(world.grouped) as statements:
        grouped = world.grouped.append_many(requests)
    alone = _one_by_one(world.alone, requests)
    assert [_answer(answer) for answer in grouped] == [_answer(answer) for answer in alone]
    assert grouped[1] == grouped[0]
    assert not clash or isinstance(grouped[3], IdempotencyConflict)
    assert _kinds(statements).count("SAVEPOINT") == len(requests)
    _assert_same(world.grouped, world.alone)


# --- property: random groups ------------------------------------------------------------------

_STREAMS = ["old/1", "old/2", "old/3", "new/1", "new/2"]


@settings(max_examples=examples(30), suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_groups_answer_and_store_as_one_by_one(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as directory, pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite_module, "utc_now_text", lambda: FROZEN)
        world = _World(Path(directory))
        try:
            _check_random_group(data, world)
        finally:
            world.close()


def _check_random_group(data: st.DataObject, world: _World) -> None:
    stored = [("old/1", world.old1[0]), ("old/1", world.old1[1]), ("old/2", world.old2[0]), ("old/3", world.old3[0])]
    fences = [None, None, None, world.good, world.stale, world.missing]
    requests: list[AppendRequest] = []
    alone: list[list[Event] | JixuError] = []
    draw: Callable[[st.SearchStrategy[Any]], Any] = data.draw
    for number in range(draw(st.integers(2, 10))):
        kind = draw(st.sampled_from(["new"] * 6 + ["retry", "retry elsewhere", "partly", "repeat", "repeat elsewhere"]))
        stream = draw(st.sampled_from(_STREAMS))
        events: list[NewEvent] = _events(f"r{number}", draw(st.integers(1, 3)))
        if kind == "retry":
            stream, events = draw(st.sampled_from(stored))
        elif kind == "retry elsewhere":  # stored ids in another stream: IdempotencyConflict
            events = draw(st.sampled_from(stored))[1]
        elif kind == "partly":
            events = [*events, *draw(st.sampled_from(stored))[1][:draw(st.integers(1, 2))]]
        elif kind.startswith("repeat") and requests:  # ids of an earlier append of this group: the savepoint path
            earlier = draw(st.sampled_from(requests))
            events = list(earlier.events)
            stream = earlier.stream if kind == "repeat" else stream
        info = world.alone.stream_info(stream)
        head = info.head_seq if info else 0
        expected = draw(st.one_of(st.just(head), st.integers(0, 6)))
        request = AppendRequest(stream, events, expected, draw(st.sampled_from(fences)))
        requests.append(request)
        alone += _one_by_one(world.alone, [request])  # made one by one as the group is drawn
    ids = [event_.id for request in requests for event_ in request.events]
    event("savepoint path" if len(set(ids)) < len(ids) else "batched path")
    for answer in alone:
        event(f"answers include {type(answer).__name__}")
    grouped = world.grouped.append_many(requests)
    assert [_answer(answer) for answer in grouped] == [_answer(answer) for answer in alone]
    _assert_same(world.grouped, world.alone)
