"""What only the SQLite store has: its file, pragmas, triggers, schema versions and failure modes."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import (
    InvalidInput,
    SchemaTooNew,
    StoreError,
    StoreLocked,
    StoreNotFound,
    StoreReadOnly,
    UnsupportedStoreUrl,
)
from jixu.ledger import MemoryStore, NewEvent, SQLiteStore, open_store
from jixu.ledger.sqlite import SCHEMA_VERSION
from tests.helpers import spawn_python


def test_checkpoints_renewals_and_lease_releases_commit_without_waiting_for_the_disk_and_the_rest_does(
        sqlite_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decisions 0017 and 0042: only writes whose loss in a power failure is harmless skip the fsync."""
    from jixu.ledger import Checkpoint

    with SQLiteStore(sqlite_path) as store:
        seen: list[tuple[str, int]] = []
        write = store._write

        def spy(fn: Any, *, sync: bool = True) -> Any:
            def observed(conn: sqlite3.Connection) -> Any:
                seen.append((getattr(fn, "__qualname__", "?").split(".")[1], conn.execute(
                    "PRAGMA synchronous").fetchone()[0]))
                return fn(conn)
            return write(observed, sync=sync)

        monkeypatch.setattr(store, "_write", spy)
        store.append("orders/1", [NewEvent("order.placed")], 0)
        fence = store.acquire_lease("orders/1/turn", "me", 30)
        store.renew_lease(fence, 30)
        store.write_checkpoint(Checkpoint("orders/1", "main", 1, 1, store.stream_info("orders/1").head_hash,
                                          "{}", "d"))
        store.release_lease(fence)
        store.enqueue("work/1", "fleet")
        claim = store.claim_work("me", 30, lambda census: ["fleet"])
        assert claim is not None
        store.renew_work(claim, 30)
        store.finish_work(claim)
        # 2 = FULL, 1 = NORMAL (the append goes through its own group-commit path at FULL). Taking a lease or
        # a work claim and finishing one stay durable: they are acted on at once.
        assert seen == [("_change_lease", 2), ("_change_leases", 1), ("_write_checkpoints", 1),
                        ("_release_lease", 1), ("_change_work", 2), ("_claim_works", 2), ("_renew_works", 1),
                        ("_change_work", 2)]
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2

        def failing(conn: sqlite3.Connection) -> None:
            raise StoreError("refused inside the transaction")

        with pytest.raises(StoreError):
            write(failing, sync=False)
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # restored after a failure too
        assert store.get_lease("orders/1/turn").released  # type: ignore[union-attr]


def test_the_database_refuses_update_and_delete_of_events(sqlite_path: Path) -> None:
    with SQLiteStore(sqlite_path) as store:
        store.append("orders/1", [NewEvent("order.placed", {"total": 1})], 0)
    raw = sqlite3.connect(sqlite_path)
    with pytest.raises(sqlite3.DatabaseError, match="immutable"):
        raw.execute("UPDATE jixu_events SET data = '{\"total\":2}'")
    with pytest.raises(sqlite3.DatabaseError, match="immutable"):
        raw.execute("DELETE FROM jixu_events")
    raw.close()
    with SQLiteStore(sqlite_path) as store:
        assert store.read("orders/1")[0].data == {"total": 1}
        assert store.verify("orders/1").valid


def test_durable_defaults_wal_and_synchronous_full(sqlite_path: Path) -> None:
    with SQLiteStore(sqlite_path) as store:
        assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store.durability == "synchronous=FULL"
    with SQLiteStore(sqlite_path, synchronous="NORMAL") as store:
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1
        assert store.durability == "synchronous=NORMAL"
    with pytest.raises(InvalidInput):
        SQLiteStore(sqlite_path, synchronous="OFF")  # type: ignore[arg-type]


def test_a_new_database_records_its_schema_version(sqlite_path: Path) -> None:
    with SQLiteStore(sqlite_path) as store:
        assert store.schema_version() == SCHEMA_VERSION
    rows = sqlite3.connect(sqlite_path).execute("SELECT version, description FROM jixu_schema").fetchall()
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))


def test_a_database_from_a_newer_jixu_fails_closed(sqlite_path: Path) -> None:
    SQLiteStore(sqlite_path).close()
    raw = sqlite3.connect(sqlite_path)
    raw.execute("INSERT INTO jixu_schema VALUES (?, '2030-01-01', 'from the future')", (SCHEMA_VERSION + 1,))
    raw.commit()
    raw.close()
    with pytest.raises(SchemaTooNew, match="upgrade jixu"):
        SQLiteStore(sqlite_path)
    with pytest.raises(SchemaTooNew):
        SQLiteStore(sqlite_path, read_only=True)


def test_a_missing_database_is_reported_when_creation_is_not_allowed(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFound):
        SQLiteStore(tmp_path / "absent.db", create=False)
    with pytest.raises(StoreNotFound):
        SQLiteStore(tmp_path / "absent.db", read_only=True)
    assert not (tmp_path / "absent.db").exists()


def test_an_empty_file_is_not_made_a_jixu_database_when_creation_is_not_allowed(tmp_path: Path) -> None:
    """A reader (every CLI command that only reads) opens with create=False: an empty file, or one an editor
    truncated, must not come out of it holding a fresh jixu schema."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(StoreNotFound, match="holds no jixu schema"):
        SQLiteStore(empty, create=False)
    assert empty.read_bytes() == b"" and not (tmp_path / "empty.db-wal").exists()
    with SQLiteStore(empty) as store:  # creation allowed: the schema is installed
        assert store.list_streams() == []
    with SQLiteStore(empty, create=False) as store:
        assert store.list_streams() == []


def test_a_memory_url_opened_without_creation_is_not_found_and_takes_no_options() -> None:
    with pytest.raises(StoreNotFound, match="one process's memory"):
        open_store("memory://", create=False)
    with pytest.raises(InvalidInput, match="takes no path or options"):
        open_store("memory://?create=false")


def test_a_read_only_store_reads_but_refuses_every_write(sqlite_path: Path) -> None:
    with SQLiteStore(sqlite_path) as store:
        store.append("orders/1", [NewEvent("order.placed")], 0)
    with SQLiteStore(sqlite_path, read_only=True) as store:
        assert len(store.read("orders/1")) == 1
        assert store.verify("orders/1").valid
        with pytest.raises(StoreReadOnly):
            store.append("orders/1", [NewEvent("order.paid")], 1)
        with pytest.raises(StoreReadOnly):
            store.acquire_lease("k", "me", 10)
    with SQLiteStore(sqlite_path) as store:
        assert len(store.read("orders/1")) == 1


def test_a_file_that_is_not_a_jixu_database_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a jixu SQLite database"):
        SQLiteStore(junk)
    other = tmp_path / "other.db"
    raw = sqlite3.connect(other)
    raw.execute("CREATE TABLE customers (id INTEGER)")
    raw.commit()
    raw.close()
    with pytest.raises(StoreError, match="not a jixu database"):
        SQLiteStore(other)


_HOLD_LOCK = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE"); print("locked", flush=True); time.sleep(float(sys.argv[2])); c.execute("ROLLBACK")
"""


def test_a_database_locked_past_the_busy_timeout_raises_store_locked(sqlite_path: Path) -> None:
    store = SQLiteStore(sqlite_path, busy_timeout=0.2)
    holder = spawn_python(_HOLD_LOCK, str(sqlite_path), "3")
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    started = time.monotonic()
    with pytest.raises(StoreLocked, match="busy timeout"):
        store.append("orders/1", [NewEvent("order.placed")], 0)
    assert time.monotonic() - started < 2.5
    holder.wait(timeout=10)
    assert store.append("orders/1", [NewEvent("order.placed")], 0)[0].seq == 1
    store.close()


def test_a_closed_store_refuses_use(sqlite_path: Path) -> None:
    store = SQLiteStore(sqlite_path)
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.read("orders/1")


@pytest.mark.parametrize(("url", "synchronous"), [
    ("sqlite:///{dir}/a.db", "FULL"),
    ("sqlite:///{dir}/a.db?synchronous=normal", "NORMAL"),
    ("{dir}/a.db", "FULL"),
])
def test_open_store_understands_urls_and_paths(tmp_path: Path, url: str, synchronous: str) -> None:
    store = open_store(url.format(dir=tmp_path))
    assert isinstance(store, SQLiteStore)
    assert store.synchronous == synchronous
    assert Path(store.path) == tmp_path / "a.db"
    store.close()


def test_open_store_relative_sqlite_url_is_relative_to_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///rel.db") as store:
        store.append("a/1", [NewEvent("a.b")], 0)
    assert (tmp_path / "rel.db").exists()
    assert isinstance(open_store("memory://"), MemoryStore)


@pytest.mark.parametrize("url", ["redis://localhost/0", "mysql://x"])
def test_open_store_rejects_unknown_schemes(url: str) -> None:
    with pytest.raises(UnsupportedStoreUrl):
        open_store(url)


@pytest.mark.parametrize("url", ["sqlite:///x.db?synchronous=bogus", "sqlite:///x.db?color=red",
                                 "sqlite://host/x.db", "sqlite:///"])
def test_open_store_rejects_bad_url_options(tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInput):
        open_store(url)
    assert not (tmp_path / "x.db").exists()


_MIGRATE = """
import sys, time
from jixu.ledger import SQLiteStore
start = float(sys.argv[2])
while time.time() < start: pass
s = SQLiteStore(sys.argv[1]); print(s.schema_version())
"""


def test_two_processes_opening_a_new_file_at_once_migrate_it_once(sqlite_path: Path) -> None:
    start = time.time() + 0.5
    procs = [spawn_python(_MIGRATE, str(sqlite_path), str(start)) for _ in range(3)]
    outputs = [p.communicate(timeout=30) for p in procs]
    assert [o[0].strip() for o in outputs] == [str(SCHEMA_VERSION)] * 3, outputs
    rows = sqlite3.connect(sqlite_path).execute("SELECT count(*) FROM jixu_schema").fetchone()[0]
    assert rows == SCHEMA_VERSION


def test_verify_reads_one_snapshot_while_another_process_appends(sqlite_path: Path) -> None:
    with SQLiteStore(sqlite_path) as store:
        store.append("s/1", [NewEvent("agent.step", {"i": i}) for i in range(3000)], 0)
    writer = spawn_python(_APPEND_FOREVER, str(sqlite_path))
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "appending"
        with SQLiteStore(sqlite_path) as reader:
            reports = [reader.verify("s/1") for _ in range(15)]
            counts = {r.count for r in reports}
    finally:
        writer.kill()
        writer.wait()
    assert all(r.valid for r in reports), [r for r in reports if not r.valid][:1]
    assert len(counts) > 1, "the writer should have appended between verifications"


def test_a_stream_that_does_not_verify_is_judged_on_the_snapshot_its_rows_were_hashed_in(
        sqlite_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify keeps no rows: a break makes it read them again, and that read is the first one's snapshot."""
    from jixu.ledger import chain
    from jixu.ledger.event import compute_hash, utc_now_text
    from jixu.ledger.ids import new_id

    with SQLiteStore(sqlite_path) as store:
        last = store.append("s/1", [NewEvent("agent.step", {"i": i}) for i in range(5)], 0)[-1]
    raw = sqlite3.connect(sqlite_path, isolation_level=None)
    raw.execute("UPDATE jixu_streams SET head_hash = ? WHERE stream = 's/1'", ("f" * 64,))
    # What another writer commits while the rows are hashed: a well-linked sixth event and the head it makes,
    # after which the stream verifies again.
    sixth = {"id": new_id(), "stream": "s/1", "seq": 6, "type": "agent.step", "data_json": '{"i":5}',
             "meta_json": "{}", "recorded_at": utc_now_text(), "prev_hash": last.hash}
    sixth_hash = compute_hash(**sixth)  # type: ignore[arg-type]
    hashed = chain.envelope_text_of

    def text_of(*fields: Any) -> str:
        if fields[2] == 5 and raw.execute("SELECT head_seq FROM jixu_streams").fetchone()[0] == 5:
            raw.execute("INSERT INTO jixu_events (id, stream, seq, type, data, meta, recorded_at, prev_hash, hash) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (*sixth.values(), sixth_hash))
            raw.execute("UPDATE jixu_streams SET head_seq = 6, head_hash = ? WHERE stream = 's/1'", (sixth_hash,))
        return hashed(*fields)

    monkeypatch.setattr(chain, "envelope_text_of", text_of)
    with SQLiteStore(sqlite_path) as store:
        during = store.verify("s/1")
        after = store.verify("s/1")
    assert (during.valid, during.reason, during.first_bad_seq, during.count) == (False, "head_mismatch", 5, 5)
    assert (after.valid, after.count, after.head_hash) == (True, 6, sixth_hash)


_APPEND_FOREVER = """
import sys
from jixu.ledger import SQLiteStore, NewEvent
store = SQLiteStore(sys.argv[1], synchronous="NORMAL")
head = store.stream_info("s/1").head_seq
print("appending", flush=True)
while True:
    head = store.append("s/1", [NewEvent("agent.step", {"i": head})], head)[-1].seq
"""


def test_events_without_a_head_record_are_reported_and_appends_fail_clearly(sqlite_path: Path) -> None:
    with SQLiteStore(sqlite_path) as store:
        store.append("s/1", [NewEvent("agent.step", {"i": i}) for i in range(5)], 0)
    raw = sqlite3.connect(sqlite_path)
    raw.execute("DELETE FROM jixu_streams")
    raw.commit()
    raw.close()
    with SQLiteStore(sqlite_path) as store:
        report = store.verify("s/1")
        assert (report.valid, report.reason, report.first_bad_seq) == (False, "head_mismatch", 1)
        with pytest.raises(StoreError, match="disagree"):
            store.append("s/1", [NewEvent("agent.step")], 0)


_COMMIT_FAILS = """
import json, resource, signal, sys
from jixu.errors import JixuError
from jixu.ledger import Checkpoint, NewEvent, SQLiteStore
from jixu.ledger.store import AppendRequest

store = SQLiteStore(sys.argv[1])
store.append("c/1", [NewEvent("a.b")], 0)  # the WAL is grown (decision 0018) and restarts at its start
big = [NewEvent("a.b", {"blob": "x" * 300_000})]  # ~75 pages: past the limit below, written at COMMIT
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
# From here a write past 64 KiB of any file fails (EFBIG), as on a full disk: the commit's WAL write fails.
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
trace = []
store._conn.set_trace_callback(trace.append)
out = {}
try:
    store.append("c/1", big, 1)
    out["alone"] = "stored"
except JixuError as error:
    out["alone"] = [type(error).__name__, error.code, str(error), trace[-1]]
answers = store.append_many([AppendRequest("c/1", big, 1), AppendRequest("c/2", [NewEvent("a.b")], 0),
                             AppendRequest("c/1", [NewEvent("a.b")], 0)])
out["group"] = [type(a).__name__ if isinstance(a, JixuError) else "stored" for a in answers]
out["group_message"] = str(answers[1])
try:  # any other write: here a checkpoint, committed through _write
    store.write_checkpoint(Checkpoint("c/1", "big", 1, 1, "a" * 64, '"' + "x" * 300_000 + '"', "d" * 64))
    out["checkpoint"] = "stored"
except JixuError as error:
    out["checkpoint"] = [type(error).__name__, str(error)]
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
out["heads"] = [store.stream_info("c/1").head_seq, store.stream_info("c/2")]
out["again"] = [e.seq for e in store.append("c/1", big, 1)]
out["valid"] = store.verify("c/1").valid
print(json.dumps(out))
"""


def test_a_commit_that_fails_reports_the_appends_outcome_as_unknown(sqlite_path: Path) -> None:
    """A real COMMIT failure: the WAL write of the commit is refused (a file size limit, as on a full disk)."""
    child = spawn_python(_COMMIT_FAILS, str(sqlite_path))
    stdout, stderr = child.communicate(timeout=60)
    assert child.returncode == 0, stderr
    out = json.loads(stdout)
    name, code, message, statement = out["alone"]
    assert (name, code, statement) == ("OutcomeUnknown", "outcome_unknown", "COMMIT")
    assert "the commit of this append failed" in message and "whether it was stored is unknown" in message
    assert "nothing" not in message
    # The shared commit fails for the two appends it carried; the third was refused on its own before it.
    assert out["group"] == ["OutcomeUnknown", "OutcomeUnknown", "ConcurrencyError"]
    assert "whether it was stored is unknown" in out["group_message"] and "nothing" not in out["group_message"]
    assert out["checkpoint"][0] == "OutcomeUnknown" and "the commit of this write failed" in out["checkpoint"][1]
    # Here the commit never wrote its commit frame, so reading back finds nothing, and the same batch goes in.
    assert out["heads"] == [1, None] and out["again"] == [2] and out["valid"] is True


def test_reads_do_not_wait_for_the_writer_and_see_every_commit_that_returned(sqlite_path: Path) -> None:
    """The writing connection holds its lock through a commit's fsync: reads that took that lock waited behind every
    commit (HTTP requests of `jixu serve` queued behind the worker's commits). Reads have a connection of their own,
    which sees each commit as soon as it returned and cannot write."""
    import threading

    with SQLiteStore(sqlite_path) as store:
        store.append("orders/1", [NewEvent("order.placed")], 0)
        fence = store.acquire_lease("orders/1/turn", "me", 30)
        read: list[Any] = []
        with store._lock:  # the writer is busy (a commit waiting for the disk)
            reader = threading.Thread(target=lambda: read.extend([
                store.read("orders/1"), store.get_lease("orders/1/turn"), store.stream_info("orders/1"),
                store.now(), store.verify("orders/1")]))
            reader.start()
            reader.join(10)
            assert not reader.is_alive(), "a read waited for the writer's lock"
        events, lease, info, _now, report = read
        assert [e.type for e in events] == ["order.placed"] and lease.epoch == fence.epoch
        assert info.head_seq == 1 and report.valid
        for seq in range(2, 6):  # each commit is seen by the next read
            store.append("orders/1", [NewEvent("order.changed", {"n": seq})], seq - 1)
            assert store.stream_info("orders/1").head_seq == seq and len(store.read("orders/1")) == seq
        assert store._reader is not None
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store._reader.execute("DELETE FROM jixu_leases")
    with pytest.raises(StoreError, match="closed"):
        store.read("orders/1")
    with SQLiteStore(sqlite_path, read_only=True) as reader_store:
        assert reader_store._reader is None and len(reader_store.read("orders/1")) == 5


def test_a_read_that_fails_leaves_no_snapshot_behind(sqlite_path: Path) -> None:
    """A damaged row made a lazily read result raise mid-read (an untyped ``ValueError``): its unfinished
    statement kept the reader in its snapshot for as long as the exception lived, and every later read of the
    process, its own appends included, saw the old state while the WAL grew. The failure is typed and later reads
    see every commit."""
    with SQLiteStore(sqlite_path) as store:
        store.append("orders/1", [NewEvent("order.placed")], 0)
        for key in ("k1", "k2", "k3"):
            store.record_use(key)
        other = sqlite3.connect(sqlite_path, isolation_level=None)
        other.execute("UPDATE jixu_last_used SET used_at = 'not a time' WHERE key = 'k2'")
        with pytest.raises(StoreError, match="damaged") as failed:
            store.last_used(["k1", "k2", "k3"])
        kept = failed.value  # an error report keeps the exception (and its traceback) alive
        store.append("orders/1", [NewEvent("order.changed")], 1)
        assert store.stream_info("orders/1").head_seq == 2 and len(store.read("orders/1")) == 2
        other.execute("INSERT INTO jixu_last_used VALUES ('k4', 1.0)")
        assert store.last_used(["k4"]) == {"k4": 1.0}
        assert kept is not None
        other.close()


def test_a_store_that_opens_can_read_whatever_file_descriptors_are_left(sqlite_path: Path) -> None:
    """The reader connection opened its files at its first read: with the open files near their limit, the store
    opened and then every read failed while appends succeeded. At any number of descriptors left, a store either
    fails to open (typed) or reads."""
    with SQLiteStore(sqlite_path) as store:
        store.append("orders/1", [NewEvent("order.placed")], 0)
    outcomes = []
    for left in range(2, 10):
        opened: list[int] = []
        try:
            while True:
                try:
                    opened.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    break
            for fd in opened[len(opened) - left:]:
                os.close(fd)
            del opened[len(opened) - left:]
            try:
                store = SQLiteStore(sqlite_path)
            except StoreError:
                outcomes.append((left, "refused"))
                continue
            try:
                assert len(store.read("orders/1")) == 1, "a store that opened reads"
                outcomes.append((left, "reads"))
            finally:
                store.close()
        finally:
            for fd in opened:
                os.close(fd)
    assert outcomes[0][1] == "refused" and outcomes[-1][1] == "reads", outcomes
