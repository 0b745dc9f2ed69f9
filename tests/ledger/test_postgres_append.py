"""The PostgreSQL append in one statement: ``jixu_append_v4`` (schema migration 4; ``jixu_append``, 3, before).

The database seals the batch, so these tests hold it to the Python definition:
every hash it computes equals :func:`jixu.ledger.event.seal` over the same
bytes, whatever the payload; fences, heads and ids are decided under the
same locks as before; and databases at schema versions 2 and 3 upgrade on open.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from jixu.errors import ConcurrencyError, FencingError, IdempotencyConflict, JixuError, SchemaTooNew
from jixu.ledger import NewEvent, PostgresStore
from jixu.ledger import postgres as postgres_module
from jixu.ledger.chain import row_hash
from jixu.ledger.encoding import canonical_text
from jixu.ledger.event import GENESIS_HASH, PreparedEvent, StoredRow, format_timestamp, prepare, seal
from jixu.ledger.postgres import MIGRATIONS, SCHEMA_VERSION
from jixu.ledger.store import Fence
from tests.conftest import PostgresSchema

_COLUMNS = "id, stream, seq, type, data, meta, recorded_at, prev_hash, hash"
_RECORDED_AT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


@pytest.fixture
def url(postgres_dsn: str) -> Iterator[str]:
    made = PostgresSchema(postgres_dsn)
    yield made.url
    made.drop()


def raw(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def stored(url: str, stream: str) -> list[StoredRow]:
    with raw(url) as conn:
        return [StoredRow(*row) for row in conn.execute(
            f"SELECT {_COLUMNS} FROM jixu_events WHERE stream = %s ORDER BY seq", (stream,)).fetchall()]


def assert_sealed_like_python(rows: list[StoredRow], genesis: str = GENESIS_HASH) -> None:
    """Each row is exactly what ``seal`` makes of its content, place, clock text and predecessor."""
    prev = genesis
    for seq, row in enumerate(rows, start=1):
        prepared = PreparedEvent(row.id, row.type, row.data_json, row.meta_json,
                                 len(row.data_json.encode()) + len(row.meta_json.encode()))
        assert row == seal(prepared, stream=row.stream, seq=seq, prev_hash=prev, recorded_at=row.recorded_at)
        assert row_hash(row) == row.hash and _RECORDED_AT.match(row.recorded_at), row
        prev = row.hash


TRICKY: list[dict[str, Any]] = [
    {"text": "ü é ß 中文 עברית العربية"},
    {"emoji": "🦀🧪👩‍👩‍👧‍👦 \U0001f600", "flag": "🇯🇵"},
    {"quotes": "she said \"hi\" and 'bye'", "backslash": "C:\\path\\to\\file \\\\ \\u0041 \\n"},
    {"escapes": "line\nbreak\ttab\rreturn\b\f", "nul": "a\x00b", "controls": "\x01\x1f\x7f\x80\x9f"},
    {"separators": "\u2028\u2029", "bom": "\ufeff", "replacement": "\ufffd", "max": "\U0010ffff"},
    {"weird keys": {"": 1, "é": 2, "\"": 3, "\\": 4, "a\u0000": 5, "🦀": 6}},
    {"numbers": [0, -0.0, 1e-7, 1.5e300, 2**63, -(2**70), 0.1 + 0.2], "bools": [True, False, None]},
    {"nested": {"list": [[], {}, [{"a": [1, {"b": "c"}]}]]}},
    {"sql": "'); DROP TABLE jixu_events; --", "dollar": "$fn$ $$ $1", "percent": "%s %(x)s {}"},
    {"json in a string": "{\"data\":1,\"id\":\"x\"}", "braces": "}{][,:"},
]


def test_the_database_seals_tricky_payloads_exactly_as_python_does(url: str) -> None:
    events = [NewEvent("payload.tricky", data, meta={"i": i, "note": "ünïcödé ✓"}) for i, data in enumerate(TRICKY)]
    events.append(NewEvent("payload.empty"))
    with PostgresStore(url) as store:
        assert store._fast_append, "the test server should store UTF-8 (the fast path is under test)"
        returned = store.append("tricky/1", events, 0)
        again = store.append("tricky/1", [NewEvent("payload.tricky", TRICKY[1])], len(events))
        rows = stored(url, "tricky/1")
        assert_sealed_like_python(rows)
        assert [r.to_event() for r in rows] == returned + again == store.read("tricky/1")
        assert rows[-1].prev_hash == rows[-2].hash
        assert [r.data_json for r in rows[:len(TRICKY)]] == [canonical_text(d) for d in TRICKY]
        assert store.verify("tricky/1").valid


def test_a_large_payload_and_a_large_batch_are_sealed_exactly(url: str) -> None:
    big = {"blob": "🦀\\\"x" * 150_000, "more": ["é" * 1000] * 100}  # ~1 MB of UTF-8
    many = [NewEvent("agent.step", {"i": i, "s": "\"\\\n" * (i % 7), "u": "ü" * (i % 13)}) for i in range(2000)]
    with PostgresStore(url, max_payload_bytes=2_000_000) as store:
        store.append("big/1", [NewEvent("payload.big", big)], 0)
        store.append("big/1", many, 1)
        info = store.stream_info("big/1")
        assert info is not None and info.head_seq == 2001
        rows = stored(url, "big/1")
        assert len(rows) == 2001 and len({r.recorded_at for r in rows[1:]}) == 1  # one clock reading per batch
        assert_sealed_like_python(rows)
        assert info.head_hash == rows[-1].hash
        assert store.verify("big/1").valid


def test_a_forked_stream_starts_its_chain_at_the_given_genesis(url: str) -> None:
    with PostgresStore(url) as store:
        parent = store.append("parent/1", [NewEvent("a.b", {"n": n}) for n in range(3)], 0)
        store.append("child/1", [NewEvent("a.b", {"n": 9})], 0, genesis_hash=parent[1].hash)
        rows = stored(url, "child/1")
        assert_sealed_like_python(rows, genesis=parent[1].hash)
        info = store.stream_info("child/1")
        assert info is not None and info.genesis_hash == parent[1].hash and info.created_at == rows[0].recorded_at


def test_recorded_at_is_the_database_clock_in_the_store_text_form(url: str) -> None:
    with PostgresStore(url) as store, raw(url) as conn:
        before = conn.execute("SELECT clock_timestamp()").fetchone()
        [event] = store.append("clock/1", [NewEvent("a.b")], 0)
        after = conn.execute("SELECT clock_timestamp()").fetchone()
    assert before is not None and after is not None
    assert format_timestamp(before[0]) <= event.recorded_at <= format_timestamp(after[0])


# --- fences ----------------------------------------------------------------------------------------


def test_every_fence_refusal_is_worded_as_fence_problem_words_it(url: str) -> None:
    with PostgresStore(url) as store:
        with pytest.raises(FencingError, match="no lease exists for key 'k/none'"):
            store.append("f/1", [NewEvent("a.b")], 0, Fence("k/none", "w1", 1))
        old = store.acquire_lease("k/1", "w1", 0.2)
        time.sleep(0.3)
        with pytest.raises(FencingError, match=r"lease 'k/1' \(owner 'w1', epoch 1\) expired \d+\.\d{3}s ago by "
                                               "the store's clock"):
            store.append("f/1", [NewEvent("a.b")], 0, old)
        new = store.acquire_lease("k/1", "w2", 30)
        with pytest.raises(FencingError, match=r"fence \('w1', epoch 1\) on 'k/1' is stale: the lease is now held "
                                               r"by 'w2' at epoch 2") as info:
            store.append("f/1", [NewEvent("a.b")], 0, old)
        assert info.value.details == {"key": "k/1", "epoch": 2}
        store.append("f/1", [NewEvent("a.b")], 0, new)
        store.release_lease(new)
        with pytest.raises(FencingError, match="lease 'k/1' was released by its owner"):
            store.append("f/1", [NewEvent("a.b")], 1, new)
        assert len(store.read("f/1")) == 1


def _blocked_on_a_lock(conn: psycopg.Connection[Any], count: int = 1, timeout: float = 10.0) -> None:
    """Wait until ``count`` jixu_append calls wait for a lock another transaction holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND query LIKE '%%jixu_append%%' AND pid <> pg_backend_pid()").fetchone()
        if row and row[0] >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"fewer than {count} appends waited for the lock")


def _insert_first_event(conn: psycopg.Connection[Any], stream: str, event: NewEvent) -> None:
    """Write ``event`` as seq 1 of a new ``stream`` by hand, in ``conn``'s open transaction (as jixu would)."""
    row = seal(prepare(event), stream=stream, seq=1, prev_hash=GENESIS_HASH,
               recorded_at="2026-01-01T00:00:00.000000Z")
    conn.execute("INSERT INTO jixu_streams VALUES (%s, 1, %s, %s, %s)",
                 (stream, row.hash, GENESIS_HASH, row.recorded_at))
    conn.execute(f"INSERT INTO jixu_events ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                 (row.id, row.stream, row.seq, row.type, row.data_json, row.meta_json, row.recorded_at,
                  row.prev_hash, row.hash))


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_fence_is_judged_under_the_lease_lock_in_the_appends_own_transaction(url: str) -> None:
    """The lease moves while the append waits for it: the append sees the move and writes nothing."""
    with PostgresStore(url) as store, raw(url) as holder, raw(url) as watcher:
        fence = store.acquire_lease("k/1", "w1", 30)
        store.append("f/1", [NewEvent("a.b")], 0, fence)
        with holder.transaction():
            holder.execute("UPDATE jixu_leases SET owner = 'w2', epoch = epoch + 1 WHERE key = 'k/1'")
            thread, outcome = _in_thread(lambda: store.append("f/1", [NewEvent("a.b")], 1, fence))
            _blocked_on_a_lock(watcher)
        thread.join(10)
        assert isinstance(outcome[0], FencingError) and "now held by 'w2' at epoch 2" in str(outcome[0])
        assert len(store.read("f/1")) == 1 and store.verify("f/1").valid


# --- heads, new streams and ids under concurrency ------------------------------------------------


def test_threads_appending_to_one_stream_win_each_seq_once_and_leave_no_gap(url: str) -> None:
    threads, per_thread = 6, 25
    with PostgresStore(url, max_size=threads) as store:
        store.append("busy/1", [NewEvent("a.b", {"t": -1})], 0)
        wins: list[int] = []
        conflicts = [0]
        lock = threading.Lock()

        def work(t: int) -> None:
            done = 0
            while done < per_thread:
                info = store.stream_info("busy/1")
                assert info is not None
                try:
                    [event] = store.append("busy/1", [NewEvent("a.b", {"t": t, "n": done})], info.head_seq)
                except ConcurrencyError as error:
                    assert error.details["actual_seq"] > info.head_seq
                    with lock:
                        conflicts[0] += 1
                    continue
                with lock:
                    wins.append(event.seq)
                done += 1

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        total = 1 + threads * per_thread
        assert sorted(wins) == list(range(2, total + 1))
        rows = stored(url, "busy/1")
        assert [r.seq for r in rows] == list(range(1, total + 1))
        assert_sealed_like_python(rows)
        assert store.verify("busy/1").valid


def test_racing_creators_of_a_new_stream_get_one_winner_and_its_genesis(url: str) -> None:
    with PostgresStore(url, max_size=8) as store:
        for round_ in range(10):
            barrier = threading.Barrier(8)
            outcomes: list[Any] = []

            def create(i: int, stream: str = f"new/{round_}", barrier: threading.Barrier = barrier,
                       outcomes: list[Any] = outcomes) -> None:
                barrier.wait()
                try:
                    store.append(stream, [NewEvent("a.b", {"i": i})], 0, genesis_hash=f"{i:064x}")
                    outcomes.append(i)
                except ConcurrencyError as error:
                    outcomes.append(error.details["actual_seq"])

            workers = [threading.Thread(target=create, args=(i,)) for i in range(8)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            info = store.stream_info(f"new/{round_}")
            rows = stored(url, f"new/{round_}")
            assert info is not None and len(rows) == 1
            winner = rows[0].to_event().data["i"]
            assert sorted(outcomes) == sorted([1] * 7 + [winner]), outcomes
            assert info.genesis_hash == rows[0].prev_hash == f"{winner:064x}"
            assert_sealed_like_python(rows, genesis=info.genesis_hash)


def test_a_stream_created_while_the_append_waits_is_decided_again_under_its_lock(url: str) -> None:
    """The head row appears after the append looked: ON CONFLICT DO NOTHING, then the checks run again."""
    with PostgresStore(url) as store, raw(url) as creator, raw(url) as watcher:
        theirs = NewEvent("a.b", {"who": "them"})
        with creator.transaction():
            # Another appender's transaction, open: it holds the new stream's key until it commits.
            _insert_first_event(creator, "late/1", theirs)
            mine, outcome = _in_thread(lambda: store.append("late/1", [NewEvent("a.b", {"who": "me"})], 0))
            retry, retried = _in_thread(lambda: store.append("late/1", [theirs], 0))
            _blocked_on_a_lock(watcher, count=2)
        mine.join(10)
        retry.join(10)
        assert isinstance(outcome[0], ConcurrencyError) and outcome[0].details["actual_seq"] == 1, outcome
        assert [e.id for e in retried[0]] == [theirs.id], retried  # a retry of their batch: a no-op
        assert [r.id for r in stored(url, "late/1")] == [theirs.id]
        assert len(store.append("late/1", [NewEvent("a.b")], 1)) == 1
        assert store.verify("late/1").valid


def test_an_id_committed_in_another_stream_while_the_append_waits_is_an_idempotency_conflict(url: str) -> None:
    with PostgresStore(url) as store, raw(url) as other, raw(url) as watcher:
        shared = NewEvent("a.b", {"n": 1})
        with other.transaction():
            _insert_first_event(other, "other/1", shared)
            thread, outcome = _in_thread(lambda: store.append("mine/1", [NewEvent("a.b"), shared], 0))
            _blocked_on_a_lock(watcher)  # on the id's unique index entry: the other transaction's lock
        thread.join(10)
        assert isinstance(outcome[0], IdempotencyConflict), outcome
        assert store.stream_info("mine/1") is None and stored(url, "mine/1") == []


def test_a_stored_batch_appended_again_is_a_no_op_and_other_content_under_its_ids_conflicts(url: str) -> None:
    with PostgresStore(url) as store:
        batch = [NewEvent("a.b", {"n": n, "s": "ü🦀\"\\"}) for n in range(3)]
        first = store.append("idem/1", batch, 0)
        assert store.append("idem/1", batch, 0) == first
        assert store.append("idem/1", batch, 7) == first  # decided by the ids, before the head
        # At the right head the batch is inserted; the ids' unique index finds the stored id and the
        # whole append, head update included, is undone before the slower path decides.
        with pytest.raises(IdempotencyConflict, match="different content"):
            store.append("idem/1", [NewEvent("a.b", {"n": 99}, id=batch[0].id)], 3)
        with pytest.raises(IdempotencyConflict, match="a retried append must repeat the same batch"):
            store.append("idem/1", [NewEvent("a.b"), batch[0]], 3)
        with pytest.raises(IdempotencyConflict, match="a retried append must repeat the same batch"):
            store.append("idem/1", [batch[0], NewEvent("a.b")], 3)
        with pytest.raises(IdempotencyConflict, match="different content"):
            store.append("idem/2", [batch[1]], 0)
        info = store.stream_info("idem/1")
        assert store.read("idem/1") == first and info is not None and info.head_seq == 3
        assert info.head_hash == first[-1].hash and store.stream_info("idem/2") is None
        assert store.verify("idem/1").valid


def test_a_stored_batch_appended_again_with_a_fence_that_lost_its_lease_is_a_no_op(url: str) -> None:
    """The ids decide before the fence, as before: a retry of a committed batch returns it."""
    with PostgresStore(url) as store:
        fence = store.acquire_lease("k/1", "w1", 30)
        batch = [NewEvent("a.b", {"n": n}) for n in range(2)]
        first = store.append("idem/1", batch, 0, fence)
        store.release_lease(fence)
        assert store.append("idem/1", batch, 0, fence) == first
        with pytest.raises(FencingError, match="released by its owner"):
            store.append("idem/1", [NewEvent("a.b")], 2, fence)
        with pytest.raises(IdempotencyConflict, match="different content"):
            store.append("idem/1", [NewEvent("a.b", {"n": 9}, id=batch[0].id)], 2, fence)
        assert store.read("idem/1") == first and store.verify("idem/1").valid


# --- the schema upgrade --------------------------------------------------------------------------


def test_a_database_at_schema_2_upgrades_on_open_and_its_chains_continue(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert SCHEMA_VERSION >= 4 and MIGRATIONS[2][0] == 3
    with monkeypatch.context() as patch:  # the jixu before migration 3: two migrations, the old append
        patch.setattr(postgres_module, "MIGRATIONS", MIGRATIONS[:2])
        patch.setattr(postgres_module, "SCHEMA_VERSION", 2)
        patch.setattr(PostgresStore, "_append", PostgresStore._append_slowly)
        with PostgresStore(url) as old:
            assert old.schema_version() == 2
            fence = old.acquire_lease("k/1", "w1", 60)
            before = old.append("up/1", [NewEvent("a.b", {"n": n, "u": "ü"}) for n in range(3)], 0, fence)
    with raw(url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname = 'jixu_append'").fetchone() == (0,)
    with PostgresStore(url) as store:
        assert store.schema_version() == SCHEMA_VERSION
        after = store.append("up/1", [NewEvent("a.b", {"n": 3})], 3, fence)
        assert store.read("up/1") == before + after
        assert after[0].prev_hash == before[-1].hash
        assert store.verify("up/1").valid
        assert store.append("up/1", [NewEvent("a.b", {"n": 3}, id=after[0].id)], 4) == after
    with raw(url) as conn:
        versions = conn.execute("SELECT version, description FROM jixu_schema ORDER BY version").fetchall()
    assert [v for v, _ in versions] == list(range(1, SCHEMA_VERSION + 1)) and "jixu_append" in versions[2][1]
    assert_sealed_like_python(stored(url, "up/1"))


_APPEND_SQL_V3 = postgres_module._APPEND_SQL.replace("jixu_append_v4(", "jixu_append(")


def test_a_database_at_schema_3_upgrades_on_open_and_running_older_workers_keep_appending(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 4 adds jixu_append_v4 and leaves jixu_append to the workers of schema 3 still running."""
    assert SCHEMA_VERSION >= 4 and MIGRATIONS[3][0] == 4 and "jixu_append_v4" in MIGRATIONS[3][1]
    with monkeypatch.context() as patch:  # the jixu of schema 3: three migrations, jixu_append
        patch.setattr(postgres_module, "MIGRATIONS", MIGRATIONS[:3])
        patch.setattr(postgres_module, "SCHEMA_VERSION", 3)
        patch.setattr(postgres_module, "_APPEND_SQL", _APPEND_SQL_V3)
        old = PostgresStore(url)
        assert old.schema_version() == 3
        fence = old.acquire_lease("k/1", "w1", 60)
        first = old.append("up/1", [NewEvent("a.b", {"n": n, "u": "ü"}) for n in range(3)], 0, fence)
    try:
        with raw(url) as conn:
            assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname = 'jixu_append_v4'").fetchone() == (0,)
        with PostgresStore(url) as store:
            assert store.schema_version() == SCHEMA_VERSION
            second = store.append("up/1", [NewEvent("a.b", {"n": 3})], 3, fence)
            with monkeypatch.context() as patch:  # the worker of schema 3 that was already running
                patch.setattr(postgres_module, "_APPEND_SQL", _APPEND_SQL_V3)
                third = old.append("up/1", [NewEvent("a.b", {"n": 4})], 4, fence)
                with pytest.raises(ConcurrencyError):
                    old.append("up/1", [NewEvent("a.b")], 4, fence)
                assert old.append("up/1", [NewEvent("a.b", {"n": 4}, id=third[0].id)], 4, fence) == third
            fourth = store.append("up/1", [NewEvent("a.b", {"n": 5})], 5, fence)
            assert store.read("up/1") == first + second + third + fourth
            assert store.verify("up/1").valid
            assert store.append("up/1", [NewEvent("a.b", {"n": 3}, id=second[0].id)], 4, fence) == second
        with monkeypatch.context() as patch:  # a worker of schema 3 started now refuses the database
            patch.setattr(postgres_module, "MIGRATIONS", MIGRATIONS[:3])
            patch.setattr(postgres_module, "SCHEMA_VERSION", 3)
            with pytest.raises(SchemaTooNew) as info:
                PostgresStore(url)
            assert info.value.details == {"found": SCHEMA_VERSION, "supported": 3}
    finally:
        old.close()
    with raw(url) as conn:
        versions = conn.execute("SELECT version, description FROM jixu_schema ORDER BY version").fetchall()
        functions = conn.execute("SELECT count(*) FROM pg_proc WHERE proname IN ('jixu_append', 'jixu_append_v4')"
                                 ).fetchone()
    assert [v for v, _ in versions] == list(range(1, SCHEMA_VERSION + 1)) and functions == (2,)
    assert_sealed_like_python(stored(url, "up/1"))


def test_a_database_that_does_not_store_utf8_appends_on_the_slower_path(postgres_dsn: str) -> None:
    name = f"jixu_test_latin1_{time.time_ns()}"
    with raw(postgres_dsn) as conn:
        conn.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    try:
        parts = urlsplit(postgres_dsn)
        url = urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))
        with PostgresStore(url) as store:
            assert not store._fast_append
            events = store.append("latin/1", [NewEvent("a.b", {"t": "ü é ß \"\\"})], 0)
            assert store.read("latin/1") == events and store.verify("latin/1").valid
    finally:
        with raw(postgres_dsn) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# --- round trips and the pool's connection check -----------------------------------------------------


class RoundTrips:
    """Counts the driver's network exchanges that waited for the server (one per round trip)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        wait = psycopg.Connection.wait

        def counting(gen: Any) -> Any:
            try:
                sent = next(gen)
            except StopIteration as stop:
                return stop.value  # finished without touching the network (e.g. commit() in autocommit)
            while True:
                try:
                    sent = gen.send((yield sent))
                except StopIteration as stop:
                    self.count += 1
                    return stop.value

        def counted(conn: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
            return wait(conn, counting(gen), *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "wait", counted)

    def of(self, fn: Callable[[], Any]) -> int:
        before = self.count
        fn()
        return self.count - before


def test_an_append_is_one_round_trip_fenced_or_not_new_stream_or_not(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with PostgresStore(url, min_size=1, max_size=1) as store:
        fence = store.acquire_lease("k/1", "w1", 60)
        trips = RoundTrips(monkeypatch)
        assert trips.of(lambda: store.append("one/1", [NewEvent("a.b")], 0)) == 1
        assert trips.of(lambda: store.append("one/1", [NewEvent("a.b") for _ in range(50)], 1)) == 1
        assert trips.of(lambda: store.append("one/2", [NewEvent("a.b")], 0, fence)) == 1
        assert trips.of(lambda: store.append("one/2", [NewEvent("a.b")], 1, fence)) == 1
        before = trips.count
        with pytest.raises(ConcurrencyError):
            store.append("one/2", [NewEvent("a.b")], 1, fence)
        assert trips.count - before == 1
        assert store.verify("one/1").count == 51 and store.verify("one/2").count == 2


def test_appends_on_one_connection_never_scan_the_events_table(url: str) -> None:
    """No plan cached by the session turns the append into a scan of jixu_events as the table grows.

    jixu_append (migration 3) looked the batch's ids up before every append; from the sixth call on, a
    session reused a generic plan that, made while the table was empty, scanned it whole every time.
    """
    with PostgresStore(url, min_size=1, max_size=1) as store:
        fence = store.acquire_lease("k/1", "w1", 60)
        store.append("scan/1", [NewEvent("a.b")], 0, fence)
        conn = store._pool.getconn()
        with conn.transaction():  # one transaction: pg_stat_xact_user_tables counts its scans
            def scans() -> int:
                row = conn.execute("SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables "
                                   "WHERE relid = 'jixu_events'::regclass").fetchone()
                assert row is not None
                return int(row[0])

            before = scans()
            for n in range(1, 41):
                batch = [prepare(NewEvent("a.b", {"n": n, "i": i})) for i in range(3)]
                assert store._append_once(conn, "scan/1", batch, 1 + 3 * (n - 1), fence, GENESIS_HASH) is not None
            assert scans() == before
        store._pool.putconn(conn)
        assert store.verify("scan/1").count == 121


def test_a_connection_idle_past_the_threshold_is_checked_before_use(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with PostgresStore(url, min_size=1, max_size=1) as store:
        store.append("idle/1", [NewEvent("a.b")], 0)
        trips = RoundTrips(monkeypatch)
        assert trips.of(lambda: store.stream_info("idle/1")) == 1
        monkeypatch.setattr(postgres_module, "_IDLE_CHECK_SECONDS", 0.0)
        assert trips.of(lambda: store.stream_info("idle/1")) == 2  # the ping, then the query


def test_a_connection_comes_back_to_the_pool_in_the_callers_thread_after_success_or_failure(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No pool worker thread takes part in a checkout or a return; a failed operation counts as recent use."""
    with PostgresStore(url, min_size=1, max_size=4) as store:
        tasks: list[str] = []
        run_task = store._pool.run_task
        monkeypatch.setattr(store._pool, "run_task", lambda task: (tasks.append(type(task).__name__), run_task(task)))
        for seq in range(20):
            store.append("back/1", [NewEvent("a.b")], seq)
            assert store._pool.get_stats()["pool_available"] == 1  # already back, no hand-off pending
        with pytest.raises(ConcurrencyError):
            store.append("back/1", [NewEvent("a.b")], 0)
        assert tasks == [] and store._pool.get_stats()["pool_available"] == 1
        trips = RoundTrips(monkeypatch)
        assert trips.of(lambda: store.stream_info("back/1")) == 1  # the failed append was a use: no ping
        monkeypatch.setattr(postgres_module, "_IDLE_CHECK_SECONDS", 0.0)
        assert trips.of(lambda: store.stream_info("back/1")) == 2


def test_appends_on_a_connection_share_one_cursor_which_survives_refusals_and_is_replaced_when_closed(
    url: str,
) -> None:
    with PostgresStore(url, min_size=1, max_size=1) as store:
        store.append("cur/1", [NewEvent("a.b")], 0)
        cursor = store._run(lambda conn: conn.append_cursor())
        reused = NewEvent("a.b")
        store.append("cur/2", [reused], 0)
        with pytest.raises(ConcurrencyError):
            store.append("cur/1", [NewEvent("a.b")], 0)
        with pytest.raises(IdempotencyConflict):  # the unique violation, then the slower path
            store.append("cur/1", [NewEvent("a.b", {"other": 1}, id=reused.id)], 1)
        store.append("cur/1", [NewEvent("a.b")], 1)
        assert store._run(lambda conn: conn.append_cursor()) is cursor
        cursor.close()
        store.append("cur/1", [NewEvent("a.b")], 2)
        assert store._run(lambda conn: conn.append_cursor()) is not cursor
        assert [e.seq for e in store.read("cur/1")] == [1, 2, 3] and store.verify("cur/1").valid


def _kill_pooled_connection(store: PostgresStore, url: str) -> None:
    pid = store._run(lambda conn: conn.info.backend_pid)
    with raw(url) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(500):
            if not conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                break
            time.sleep(0.01)


def test_an_append_on_a_connection_the_server_dropped_runs_again_on_a_fresh_one(url: str) -> None:
    with PostgresStore(url, min_size=1, max_size=1) as store:
        store.append("drop/1", [NewEvent("a.b")], 0)
        _kill_pooled_connection(store, url)
        [event] = store.append("drop/1", [NewEvent("a.b")], 1)
        assert event.seq == 2
        _kill_pooled_connection(store, url)
        assert [e.seq for e in store.read("drop/1")] == [1, 2]
        assert store.verify("drop/1").valid


def test_a_write_that_is_unsafe_to_repeat_reports_a_dropped_connection_unless_it_was_idle(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jixu.errors import OutcomeUnknown

    with PostgresStore(url, min_size=1, max_size=1) as store:
        store.enqueue("w/1", "p")
        _kill_pooled_connection(store, url)
        with pytest.raises(OutcomeUnknown, match=r"cannot use .*whether it was committed is unknown"):
            store.claim_work("w1", 30, lambda census: sorted(census.oldest))
        assert store.list_work()[0].state == "pending"  # nothing was claimed; the next connection is fresh
        _kill_pooled_connection(store, url)
        monkeypatch.setattr(postgres_module, "_IDLE_CHECK_SECONDS", 0.0)  # as if it sat idle: pinged first
        claim = store.claim_work("w1", 30, lambda census: sorted(census.oldest))
        assert claim is not None and claim.key == "w/1"


_APPEND_ONCE = """
import sys
from jixu.ledger import NewEvent, PostgresStore
store = PostgresStore(sys.argv[1])
print("appending", flush=True)
store.append("orphan/1", [NewEvent("a.b", {"n": 2})], 1)
print("appended", flush=True)
"""


def test_an_append_whose_process_dies_while_it_waits_is_rolled_back_not_committed(url: str) -> None:
    """The one statement commits by itself; the server checks that its client is still there before it does."""
    import signal

    from tests.helpers import spawn_python

    with PostgresStore(url) as store:
        assert store._run(lambda conn: conn.execute("SHOW client_connection_check_interval").fetchone()) == ("10ms",)
        store.append("orphan/1", [NewEvent("a.b", {"n": 1})], 0)
        with raw(url) as holder, raw(url) as watcher:
            with holder.transaction():
                holder.execute("SELECT 1 FROM jixu_streams WHERE stream = 'orphan/1' FOR UPDATE")
                child = spawn_python(_APPEND_ONCE, url)
                try:
                    assert child.stdout is not None and child.stdout.readline().strip() == "appending"
                    _blocked_on_a_lock(watcher)
                finally:
                    child.send_signal(signal.SIGKILL)
                    child.wait(10)
                deadline = time.monotonic() + 10  # the server notices within the check interval
                while time.monotonic() < deadline and watcher.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%%jixu_append%%' "
                        "AND pid <> pg_backend_pid()").fetchone() != (0,):
                    time.sleep(0.01)
            assert [e.data["n"] for e in store.read("orphan/1")] == [1]
        assert store.verify("orphan/1").valid


def _terminate_the_blocked_append(watcher: psycopg.Connection[Any], ended: int = 0) -> int:
    """Wait until an append (not the one in backend ``ended``) waits for a lock, then end its backend, as a crash
    or a network cut would; its pid."""
    deadline = time.monotonic() + 10
    while True:
        row = watcher.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE "
                              "'%%jixu_append%%' AND pid NOT IN (pg_backend_pid(), %s)", (ended,)).fetchone()
        if row is not None:
            break
        assert time.monotonic() < deadline, "no append waited for the lock"
        time.sleep(0.01)
    watcher.execute("SELECT pg_terminate_backend(%s)", (row[0],))
    return int(row[0])


def _wait_for_a_blocked_append_other_than(watcher: psycopg.Connection[Any], pid: int) -> None:
    deadline = time.monotonic() + 10
    while watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE "
                          "'%%jixu_append%%' AND pid NOT IN (pg_backend_pid(), %s)", (pid,)).fetchone() == (0,):
        assert time.monotonic() < deadline, "the retry never waited for the lock"
        time.sleep(0.01)


def test_an_append_whose_connection_breaks_before_its_answer_reports_its_outcome_as_unknown(url: str) -> None:
    """The append runs again once on a fresh connection; when that breaks too, nobody knows whether it committed."""
    from jixu.errors import OutcomeUnknown

    with PostgresStore(url, min_size=1, max_size=2) as store, raw(url) as holder, raw(url) as watcher:
        store.append("gone/1", [NewEvent("a.b", {"n": 1})], 0)
        batch = [NewEvent("a.b", {"n": 2})]
        with holder.transaction():
            holder.execute("SELECT 1 FROM jixu_streams WHERE stream = 'gone/1' FOR UPDATE")
            thread, outcome = _in_thread(lambda: store.append("gone/1", batch, 1))
            first = _terminate_the_blocked_append(watcher)  # the first attempt
            _terminate_the_blocked_append(watcher, ended=first)  # the one retry, on a fresh connection
            thread.join(10)
        [error] = outcome
        assert isinstance(error, OutcomeUnknown) and error.code == "outcome_unknown", error
        assert "whether it was committed is unknown" in str(error) and "nothing" not in str(error)
        # Reading back decides: here neither attempt committed (both ended while they waited), so the same batch
        # goes in now; had one committed, this would be a no-op returning it.
        assert [e.data["n"] for e in store.read("gone/1")] == [1]
        assert [e.seq for e in store.append("gone/1", batch, 1)] == [2]
        assert store.verify("gone/1").valid


def test_an_append_whose_connection_breaks_once_is_answered_by_its_retry(url: str) -> None:
    with PostgresStore(url, min_size=1, max_size=2) as store, raw(url) as holder, raw(url) as watcher:
        store.append("once/1", [NewEvent("a.b", {"n": 1})], 0)
        with holder.transaction():
            holder.execute("SELECT 1 FROM jixu_streams WHERE stream = 'once/1' FOR UPDATE")
            thread, outcome = _in_thread(lambda: store.append("once/1", [NewEvent("a.b", {"n": 2})], 1))
            first = _terminate_the_blocked_append(watcher)
            _wait_for_a_blocked_append_other_than(watcher, first)  # the retry waits in turn for the lock
        thread.join(10)
        assert [e.seq for e in outcome[0]] == [2], outcome
        assert [e.data["n"] for e in store.read("once/1")] == [1, 2]


# --- append_many: one transaction for a batch of appends --------------------------------------------------


def test_append_many_commits_a_batch_in_one_transaction_and_answers_each_append_as_append_would(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from jixu.errors import InvalidInput
    from jixu.ledger.store import AppendRequest

    with PostgresStore(url) as store:
        stored_before = store.append("many/old", [NewEvent("a.b", {"n": 0})], 0)
        retried = [NewEvent("a.b", {"n": 1}, id=stored_before[0].id)]  # the stored event again: a retry
        lease = store.acquire_lease("many/turn", "owner-a", 60)
        store.release_lease(lease)
        store.acquire_lease("many/turn", "owner-b", 60)  # owner-a's fence is stale now
        transactions: list[bool] = []
        run = store._run

        def counted(fn: Any, **options: Any) -> Any:
            transactions.append(bool(options.get("transaction")))
            return run(fn, **options)

        store._run = counted  # type: ignore[method-assign]
        statements: list[str] = []
        execute = psycopg.Cursor.execute

        def seen(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            statements.append(str(query))
            return execute(cursor, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, "execute", seen)
        requests = [AppendRequest(f"many/{n}", [NewEvent("a.b", {"n": n})], 0) for n in range(20)]
        requests += [
            AppendRequest("many/old", [NewEvent("a.b", {"n": 9})], 0),  # wrong head
            AppendRequest("many/fenced", [NewEvent("a.b", {})], 0, lease),  # stale fence
            AppendRequest("many/old", [NewEvent("a.b", {"n": 0}, id=stored_before[0].id)], 0),  # stored batch
            AppendRequest("", [NewEvent("a.b", {})], 0),  # invalid stream
        ]
        answers = store.append_many(requests)
        monkeypatch.undo()
        store._run = run  # type: ignore[method-assign]
        appends = [q for q in statements if "jixu_append" in q]
        # One statement for the 23 valid appends; the stored batch it answered 'existing' is then decided alone.
        assert len(appends) == 2 and "jixu_append_many_v6" in appends[0], appends
        assert all(isinstance(a, list) and a[0].seq == 1 for a in answers[:20])
        assert isinstance(answers[20], ConcurrencyError)
        assert isinstance(answers[21], FencingError)
        assert isinstance(answers[22], list) and answers[22][0].id == stored_before[0].id, "a retry finds it stored"
        assert isinstance(answers[23], InvalidInput)
        assert transactions.count(True) <= 2, f"the 20 new appends share one transaction: {transactions}"
        for n in range(20):
            assert [e.data for e in store.read(f"many/{n}")] == [{"n": n}]
            assert store.verify(f"many/{n}").valid
        assert [e.data for e in store.read("many/old")] == [{"n": 0}], "the refused append wrote nothing"
        assert store.read("many/fenced") == []
        assert retried[0].id == stored_before[0].id


def test_append_many_falls_back_to_each_append_when_the_batch_transaction_aborts(url: str) -> None:
    from jixu.ledger.store import AppendRequest

    with PostgresStore(url) as store:
        stored_first = store.append("fall/1", [NewEvent("a.b", {"n": 1})], 0)
        together = store._append_together
        aborted: list[int] = []

        def racing(conn: Any, appends: Any) -> Any:
            if not aborted:
                # As a concurrent commit of the same id would: a real unique violation, which aborts the
                # batch's transaction in the database.
                aborted.append(len(appends))
                conn.execute(f"INSERT INTO jixu_events ({_COLUMNS}) SELECT {_COLUMNS} FROM jixu_events "
                             "WHERE id = %s", (stored_first[0].id,))
            return together(conn, appends)

        store._append_together = racing  # type: ignore[method-assign]
        requests = [AppendRequest("fall/0", [NewEvent("a.b", {"n": 0})], 0),
                    AppendRequest("fall/2", [NewEvent("a.b", {"n": 2})], 0),
                    AppendRequest("fall/3", [NewEvent("a.b", {"n": 3})], 0)]
        answers = store.append_many(requests)
        assert aborted == [3], "the batch was aborted"
        assert all(isinstance(a, list) and len(a) == 1 for a in answers), answers
        for n in (0, 2, 3):
            assert [e.data for e in store.read(f"fall/{n}")] == [{"n": n}], "appended once, on its own"
            assert store.verify(f"fall/{n}").valid


@pytest.mark.parametrize("where", [1, 2])  # in the middle of the batch, and last
def test_a_batch_whose_statement_meets_an_id_stored_in_another_stream_is_appended_one_by_one(
        url: str, where: int) -> None:
    """One statement appends the whole batch: an event id already stored elsewhere aborts it in the database
    (after the appends before it went through), and each append is then decided on its own."""
    from jixu.ledger.store import AppendRequest

    with PostgresStore(url) as store:
        stored = store.append("taken/1", [NewEvent("a.b", {"n": 1})], 0)[0]
        requests = [AppendRequest(f"taken/new{n}", [NewEvent("a.b", {"n": n})], 0) for n in range(3)]
        requests[where] = AppendRequest(f"taken/new{where}", [NewEvent("a.b", {"n": where}, id=stored.id)], 0)
        answers = store.append_many(requests)
        assert isinstance(answers[where], JixuError), answers[where]
        assert store.read(f"taken/new{where}") == [], "the append of a stored id wrote nothing"
        for n in {0, 1, 2} - {where}:
            appended = answers[n]
            assert isinstance(appended, list) and [e.data for e in appended] == [{"n": n}]
            assert [e.data for e in store.read(f"taken/new{n}")] == [{"n": n}], "appended once, on its own"
            assert store.verify(f"taken/new{n}").valid
        assert [e.id for e in store.read("taken/1")] == [stored.id]


_FROZEN_HOLDER = """
import os, signal, sys
from jixu.ledger import PostgresStore

store = PostgresStore(sys.argv[1])

def hold(conn):
    conn.execute("SELECT key FROM jixu_work WHERE key = %s FOR UPDATE", (sys.argv[2],)).fetchall()
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen inside the transaction, the row locked

store._run(hold, write=True, transaction=True)
"""


def test_a_process_frozen_inside_a_transaction_does_not_hold_its_rows_past_the_servers_timeout(url: str) -> None:
    """A worker paused (SIGSTOP, a frozen VM) mid-transaction keeps its row locks: claims pass over such a row
    (``SKIP LOCKED``), so without a limit on idle transactions the item would never be claimed again, whatever
    its lease says. The store's sessions end such a transaction after ``_IDLE_IN_TRANSACTION_MS``."""
    import signal

    from tests.helpers import spawn_python

    with PostgresStore(url) as store:
        store.enqueue("thread/frozen", "shop")
        holder = spawn_python(_FROZEN_HOLDER, url, "thread/frozen")
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
            assert store.claim_work("w1", 30, lambda census: sorted(census.oldest)) is None  # passed over
            deadline = time.monotonic() + postgres_module._IDLE_IN_TRANSACTION_MS / 1000 + 20
            claim = None
            while claim is None and time.monotonic() < deadline:
                time.sleep(0.2)
                claim = store.claim_work("w1", 30, lambda census: sorted(census.oldest))
            assert claim is not None and claim.key == "thread/frozen", "the frozen transaction kept the row"
            with raw(url) as conn:
                [(timeout,)] = conn.execute("SELECT current_setting('idle_in_transaction_session_timeout')")
                assert timeout == "0", "the server's own default is no limit: the store sets its own"
            assert store._run(lambda conn: conn.execute(
                "SELECT current_setting('idle_in_transaction_session_timeout')").fetchone()[0]) == "5s"
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)


def test_a_batch_of_appends_of_different_lengths_stores_each_its_own_events_in_order(url: str) -> None:
    """jixu_append_many_v6 hands each append its own slice of the statement's event arrays."""
    from jixu.ledger.store import AppendRequest

    with PostgresStore(url) as store:
        store.append("sizes/b", [NewEvent("a.b", {"n": -1})], 0)
        lengths = {"sizes/a": 3, "sizes/b": 1, "sizes/c": 4, "sizes/d": 2}
        requests = [AppendRequest(stream, [NewEvent("a.b", {"stream": stream, "n": n}) for n in range(count)],
                                  1 if stream == "sizes/b" else 0) for stream, count in lengths.items()]
        alone: list[str] = []
        append_alone = store._append

        def noted(stream: str, *args: Any) -> Any:
            alone.append(stream)
            return append_alone(stream, *args)

        store._append = noted  # type: ignore[method-assign]
        answers = store.append_many(requests)
        assert alone == [], "every append went through the batch's statement (none fell back to its own)"
        for (stream, count), answer in zip(lengths.items(), answers, strict=True):
            first = 2 if stream == "sizes/b" else 1
            assert isinstance(answer, list) and [e.seq for e in answer] == list(range(first, first + count))
            stored = store.read(stream)[first - 1:]
            assert [e.data for e in stored] == [{"stream": stream, "n": n} for n in range(count)]
            assert [e.hash for e in stored] == [e.hash for e in answer]
            assert store.verify(stream).valid
