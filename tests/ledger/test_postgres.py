"""What only the PostgreSQL store has: database-enforced immutability, migrations, the database clock, DSNs.

The contract suite (``test_store_contract.py``) already runs against PostgreSQL;
these tests cover what is specific to it, against the session's test server
(``JIXU_TEST_POSTGRES_DSN`` or a throwaway ``pgserver``), each in a fresh
schema or a fresh database.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest

from jixu.errors import (
    ConcurrencyError,
    FencingError,
    IdempotencyConflict,
    InvalidInput,
    LeaseHeld,
    SchemaTooNew,
    StoreError,
    StoreNotFound,
    StoreReadOnly,
)
from jixu.ledger import NewEvent, PostgresStore, open_store, verify
from jixu.ledger.chain import VerifyReport, row_hash
from jixu.ledger.event import StoredRow
from jixu.ledger.postgres import SCHEMA_VERSION, mask_dsn
from tests.conftest import PostgresSchema
from tests.helpers import spawn_python

_DATABASES = itertools.count(1)


@pytest.fixture
def schema(postgres_dsn: str) -> Iterator[PostgresSchema]:
    """A fresh, empty schema; ``schema.url`` opens stores in it."""
    made = PostgresSchema(postgres_dsn)
    yield made
    made.drop()


@pytest.fixture
def url(schema: PostgresSchema) -> str:
    return schema.url


@pytest.fixture
def fresh_database(postgres_dsn: str) -> Iterator[str]:
    """The URL of a brand-new, empty database (dropped afterwards)."""
    name = f"jixu_test_db_{next(_DATABASES)}_{time.time_ns()}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    parts = urlsplit(postgres_dsn)
    yield urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def raw(url: str) -> psycopg.Connection[Any]:
    """A plain autocommit connection to the same schema, as an operator (or attacker) would have."""
    return psycopg.connect(url, autocommit=True)


def steps(n: int, start: int = 0) -> list[NewEvent]:
    return [NewEvent("agent.step", {"i": start + i}) for i in range(n)]


# --- immutability, enforced by the database ---------------------------------------------------


def test_the_database_refuses_update_delete_and_truncate_of_events(url: str) -> None:
    with PostgresStore(url) as store:
        store.append("orders/1", [NewEvent("order.placed", {"total": 1})], 0)
    with raw(url) as conn:
        for statement in ("UPDATE jixu_events SET data = '{\"total\":2}'", "DELETE FROM jixu_events",
                          "TRUNCATE jixu_events", "TRUNCATE jixu_streams, jixu_events"):
            with pytest.raises(psycopg.errors.RaiseException, match="immutable"):
                conn.execute(statement)
    with PostgresStore(url) as store:
        assert store.read("orders/1")[0].data == {"total": 1}
        assert store.verify("orders/1").valid


def test_payloads_are_stored_as_canonical_text_not_jsonb(url: str) -> None:
    with PostgresStore(url) as store:
        [event] = store.append("s/1", [NewEvent("a.b", {"z": 1, "a": [1.5, "ü"], "m": {"y": None}})], 0)
    with raw(url) as conn:
        row = conn.execute("SELECT data, meta, pg_typeof(data)::text FROM jixu_events").fetchone()
        kinds = dict(conn.execute("SELECT column_name, data_type FROM information_schema.columns "
                                  "WHERE table_schema = current_schema() AND table_name = 'jixu_events'"))
    assert row == ('{"a":[1.5,"ü"],"m":{"y":null},"z":1}', "{}", "text")
    assert kinds["position"] == "bigint" and kinds["data"] == kinds["meta"] == "text"
    assert event.computed_hash() == event.hash


# --- schema versions and migrations --------------------------------------------------------------


def test_a_new_database_records_its_schema_version(fresh_database: str) -> None:
    with PostgresStore(fresh_database) as store:
        assert store.schema_version() == SCHEMA_VERSION
    with raw(fresh_database) as conn:
        rows = conn.execute("SELECT version, applied_at, description FROM jixu_schema ORDER BY version").fetchall()
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))
    assert all(r[1].endswith("Z") and r[2] for r in rows)


def test_a_database_from_a_newer_jixu_fails_closed_and_nothing_runs(url: str) -> None:
    PostgresStore(url).close()
    with raw(url) as conn:
        conn.execute("INSERT INTO jixu_schema VALUES (%s, '2030-01-01', 'from the future')", (SCHEMA_VERSION + 1,))
        conn.execute("DROP TABLE jixu_checkpoints")  # if anything ran, migration 1 would not be skipped silently
    for read_only in (False, True):
        with pytest.raises(SchemaTooNew, match="upgrade jixu") as info:
            PostgresStore(url, read_only=read_only)
        assert info.value.details == {"found": SCHEMA_VERSION + 1, "supported": SCHEMA_VERSION}
    with raw(url) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}
    assert "jixu_checkpoints" not in tables


def test_other_tables_are_fine_but_jixu_tables_without_a_schema_record_are_refused(url: str) -> None:
    with raw(url) as conn:
        conn.execute("CREATE TABLE customers (id integer)")
    with PostgresStore(url) as store:  # a shared database: other tables are normal
        store.append("s/1", steps(1), 0)
    with raw(url) as conn:
        conn.execute("DROP TABLE jixu_schema")
    with pytest.raises(StoreError, match="no jixu_schema record") as info:
        PostgresStore(url)
    assert not isinstance(info.value, StoreNotFound)


def test_create_false_and_read_only_do_not_install_a_schema(url: str) -> None:
    with pytest.raises(StoreNotFound):
        PostgresStore(url, create=False)
    with pytest.raises(StoreNotFound):
        PostgresStore(url, read_only=True)
    with raw(url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").fetchone() == (0,)
    with pytest.raises(StoreNotFound):
        verify(url, "s/1")  # verify() opens with create=False


_MIGRATE = """
import sys, time
from jixu.ledger import PostgresStore
start = float(sys.argv[2])
while time.time() < start: pass
s = PostgresStore(sys.argv[1]); print(s.schema_version()); s.close()
"""


def test_processes_opening_a_fresh_database_at_once_migrate_it_once(fresh_database: str) -> None:
    start = time.time() + 1.0
    procs = [spawn_python(_MIGRATE, fresh_database, str(start)) for _ in range(4)]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [o[0].strip() for o in outputs] == [str(SCHEMA_VERSION)] * 4, outputs
    with raw(fresh_database) as conn:
        assert conn.execute("SELECT count(*) FROM jixu_schema").fetchone() == (SCHEMA_VERSION,)


# --- the database clock ------------------------------------------------------------------------------


def test_the_lease_clock_is_the_databases(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with PostgresStore(url) as store, raw(url) as conn:
        before = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]  # type: ignore[index]
        ours = store.now()
        after = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]  # type: ignore[index]
        assert before <= ours <= after
        # The client's clock is never consulted: skew it by an hour either way and leases behave the same.
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + 3600)
        fence = store.acquire_lease("threads/1", "worker-a", 30)
        lease = store.get_lease("threads/1")
        assert lease is not None and abs(lease.heartbeat_at - real_time()) < 5
        assert lease.expires_at - lease.heartbeat_at == pytest.approx(30)
        store.append("threads/1", steps(1), 0, fence)
        monkeypatch.setattr(time, "time", lambda: real_time() - 3600)
        short = store.acquire_lease("threads/2", "worker-a", 0.2)
        time.sleep(0.3)
        with pytest.raises(FencingError, match="store's clock"):
            store.append("threads/2", steps(1), 0, short)
        recorded = store.read("threads/1")[0].recorded_at
        db_now = conn.execute("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD')").fetchone()[0]  # type: ignore[index]
        assert recorded.startswith(db_now)


@pytest.mark.parametrize("how", ["take_over_leases", "acquire_lease"])
def test_a_lease_another_owner_creates_while_leases_are_changed_is_decided_again_under_its_lock(
        url: str, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Leases change in one transaction: the rows are locked, the changes decided, then one update and one
    insert. A lease another owner creates between the lock and the insert must be decided again, never
    overwritten or shared: the take meets an epoch it did not see, the acquire a live holder."""
    from jixu.ledger import LeaseTake
    from jixu.ledger import postgres as postgres_module

    decide = postgres_module.each_change
    raced: list[str] = []

    def racing(changes: Any, apply: Any, refusals: Any = ()) -> Any:
        if not raced:
            raced.append("lease/new")
            with raw(url) as other:  # commits at once, after this transaction locked what existed
                other.execute("INSERT INTO jixu_leases (key, owner, epoch, expires_at, heartbeat_at, released) "
                              "VALUES ('lease/new', 'owner-b', 1, extract(epoch FROM clock_timestamp()) + 60, "
                              "extract(epoch FROM clock_timestamp()), false)")
        return decide(changes, apply, refusals)

    with PostgresStore(url) as store:
        kept = store.acquire_lease("lease/kept", "owner-a", 60)
        monkeypatch.setattr(postgres_module, "each_change", racing)
        if how == "take_over_leases":
            answers = store.take_over_leases([LeaseTake("lease/new", "owner-a", 60, 0),
                                              LeaseTake("lease/kept", "owner-a", 60, kept.epoch,
                                                        require_expired=False)])
            assert isinstance(answers[0], FencingError), answers
            assert answers[1].epoch == kept.epoch + 1  # type: ignore[union-attr]
        else:
            with pytest.raises(LeaseHeld):
                store.acquire_lease("lease/new", "owner-a", 60)
        assert raced == ["lease/new"]
        lease = store.get_lease("lease/new")
        assert lease is not None and (lease.owner, lease.epoch) == ("owner-b", 1), lease


# --- DSNs and errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("dsn", [
    "postgresql://jixu:s3cr3t-Pa55@127.0.0.1:1/ledgerdb",
    "postgresql://jixu@127.0.0.1:1/ledgerdb?password=s3cr3t-Pa55",
    "postgresql://jixu@127.0.0.1:1/ledgerdb?passwor%64=s3cr3t-Pa55",  # libpq decodes the name: seen by an audit
    "host=127.0.0.1 port=1 dbname=ledgerdb user=jixu password=s3cr3t-Pa55",
    "host=127.0.0.1 port=1 dbname=ledgerdb password='s3cr3t-Pa55' bogus",
    "host=127.0.0.1 password=s3cr3t-Pa55 nosuchoption=1",
    "postgresql://jixu:s3cr3t-Pa55@[::1/ledgerdb",  # libpq quotes a malformed URI in its message
])
def test_a_bad_dsn_is_a_store_error_that_never_shows_the_password(dsn: str) -> None:
    with pytest.raises(StoreError) as info:
        PostgresStore(dsn, connect_timeout=2)
    error = info.value
    assert "s3cr3t" not in str(error) and "s3cr3t" not in repr(error.to_dict()), str(error)
    if "127.0.0.1:1/" in dsn or ("port=1 dbname" in dsn and "bogus" not in dsn):
        assert "127.0.0.1" in str(error) and "ledgerdb" in str(error), str(error)


def test_a_short_password_is_hidden_without_eating_the_words_of_the_message() -> None:
    with pytest.raises(StoreError) as info:
        PostgresStore("postgresql://u:p@127.0.0.1:1/ledgerdb", connect_timeout=2)
    message = str(info.value)
    assert "port 1 failed" in message and "accepting TCP/IP" in message, message
    assert "***" not in message, message  # the password appears nowhere, so nothing was masked


def test_the_url_attribute_masks_the_password(url: str) -> None:
    userinfo = re.match(r"^postgres(?:ql)?://([^@/?]*)@", url)
    assert userinfo, f"the test server URL names no user: {url}"
    user, _, password = userinfo.group(1).partition(":")
    if not password:  # the throwaway server trusts local connections, so any password opens it
        password = "hunter22"
        url = url.replace(f"://{userinfo.group(1)}@", f"://{user}:{password}@", 1)
    with PostgresStore(url) as store:
        assert password not in store.url and f"{user}:***@" in store.url
    assert mask_dsn("host=h password=x1y2 dbname=d") == "host=h password=*** dbname=d"
    assert mask_dsn("postgres://u:p@h/db?sslmode=require&password=q") == \
        "postgres://u:***@h/db?sslmode=require&password=***"
    assert mask_dsn("postgresql://u@h/db") == "postgresql://u@h/db"


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_open_store_returns_a_postgres_store(url: str, scheme: str) -> None:
    target = scheme + url[url.index("://"):]
    with open_store(target) as store:
        assert isinstance(store, PostgresStore)
        store.append("s/1", steps(2), 0)
    with open_store(url, max_size=2) as store:
        assert [e.seq for e in store.read("s/1")] == [1, 2]
        assert verify(url, "s/1").valid


def test_a_read_only_store_reads_but_refuses_every_write(url: str) -> None:
    with PostgresStore(url) as store:
        store.append("s/1", steps(1), 0)
    with PostgresStore(url, read_only=True) as store:
        assert len(store.read("s/1")) == 1 and store.verify("s/1").valid
        with pytest.raises(StoreReadOnly):
            store.append("s/1", steps(1), 1)
        with pytest.raises(StoreReadOnly):
            store.acquire_lease("k", "me", 10)
    # The database itself refusing (read-only session, as on a standby) is StoreReadOnly too.
    assert re.search(r"[?&]options=[^&]*$", url), url
    refusing = url + quote(" -cdefault_transaction_read_only=on", safe="")  # the URL ends with options=...
    with PostgresStore(refusing) as store:
        assert len(store.read("s/1")) == 1
        with pytest.raises(StoreReadOnly, match="refuses writes"):
            store.append("s/1", steps(1), 1)


def test_a_closed_store_and_a_vanished_schema_raise_store_errors(schema: PostgresSchema) -> None:
    store = PostgresStore(schema.url)
    store.append("s/1", steps(1), 0)
    with raw(schema.admin_dsn) as conn:
        conn.execute(f"DROP SCHEMA {schema.name} CASCADE")
    with pytest.raises(StoreError, match="missing"):
        store.read("s/1")
    with pytest.raises(StoreError, match="missing"):
        store.append("s/1", steps(1), 1)
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.stream_info("s/1")


def test_a_nul_character_is_invalid_input_not_a_driver_error(url: str) -> None:
    from jixu.ledger import Checkpoint

    with PostgresStore(url) as store, pytest.raises(InvalidInput):
        store.write_checkpoint(Checkpoint("s/1", "bad\x00name", 1, 1, "a" * 64, "{}", "d" * 64))


# --- concurrency within one store (threads) ---------------------------------------------------------


def _race(n: int, fn: Any) -> list[str]:
    barrier = threading.Barrier(n)
    outcomes: list[str] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcomes.append(fn(i))
        except (ConcurrencyError, IdempotencyConflict, LeaseHeld) as error:
            outcomes.append(error.code)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(outcomes)


def test_racing_appenders_on_one_pool_yield_one_winner_per_seq(url: str) -> None:
    with PostgresStore(url, max_size=8) as store:
        for round_ in range(10):
            stream = f"race/{round_}"
            outcomes = _race(8, lambda i, stream=stream: store.append(stream, steps(2, i), 0) and "won")
            assert outcomes == ["concurrency_conflict"] * 7 + ["won"], outcomes
            head = store.stream_info(stream)
            assert head is not None and head.head_seq == 2
            outcomes = _race(8, lambda i, stream=stream: store.append(stream, steps(1, i), 2) and "won")
            assert outcomes == ["concurrency_conflict"] * 7 + ["won"], outcomes
            assert store.verify(stream).valid and store.verify(stream).count == 3


def test_a_retried_batch_racing_its_original_is_a_no_op_and_one_id_in_two_streams_conflicts(url: str) -> None:
    with PostgresStore(url, max_size=4) as store:
        for round_ in range(10):
            batch = steps(3)
            results = _race(4, lambda i, batch=batch, r=round_: str(store.append(f"same/{r}", batch, 0)))
            assert len(set(results)) == 1 and results[0].startswith("[Event("), results
            event = NewEvent("agent.step", {"i": round_})
            results = _race(2, lambda i, event=event, r=round_: store.append(f"two/{r}/{i}", [event], 0) and "won")
            assert results == ["idempotency_conflict", "won"], results


def test_racing_lease_takers_get_one_fence(url: str) -> None:
    with PostgresStore(url, max_size=6) as store:
        for round_ in range(10):
            outcomes = _race(6, lambda i, r=round_: store.acquire_lease(f"k/{r}", f"w{i}", 30) and "won")
            assert outcomes == ["lease_held"] * 5 + ["won"], outcomes


# --- verification reads one snapshot -----------------------------------------------------------------

_APPEND_FOREVER = """
import sys
from jixu.ledger import PostgresStore, NewEvent
store = PostgresStore(sys.argv[1])
head = store.stream_info("s/1").head_seq
print("appending", flush=True)
while True:
    head = store.append("s/1", [NewEvent("agent.step", {"i": head}) for _ in range(3)], head)[-1].seq
"""


def test_verify_reads_one_snapshot_while_another_process_appends(url: str) -> None:
    with PostgresStore(url) as store:
        store.append("s/1", [NewEvent("agent.step", {"i": i}) for i in range(5000)], 0)
    writer = spawn_python(_APPEND_FOREVER, url)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "appending"
        with PostgresStore(url) as reader:
            reports = [reader.verify("s/1") for _ in range(15)]
    finally:
        writer.kill()
        writer.wait()
    assert all(r.valid for r in reports), [r for r in reports if not r.valid][:1]
    assert len({r.count for r in reports}) > 1, "the writer should have appended between verifications"


# --- tampering (triggers dropped first, as someone with table rights could) --------------------------

STREAM = "tamper/1"
N = 20


@pytest.fixture
def ledger(url: str) -> str:
    """``STREAM`` with 20 events appended in batches, and a bystander stream."""
    with PostgresStore(url) as store:
        head = 0
        for size in (1, 4, 5, 10):
            batch = [NewEvent("agent.step", {"step": head + i, "amount": 1000 + head + i},
                              {"actor": "agent-1"}) for i in range(1, size + 1)]
            head = store.append(STREAM, batch, head)[-1].seq
        store.append("tamper/other", steps(1), 0)
    return url


def _tamper(url: str, *statements: tuple[str, tuple[object, ...]]) -> None:
    with raw(url) as conn, conn.transaction():
        for trigger in ("jixu_events_no_update", "jixu_events_no_delete", "jixu_events_no_truncate"):
            conn.execute(f"DROP TRIGGER {trigger} ON jixu_events")
        for sql, params in statements:
            assert conn.execute(sql, params).rowcount == 1, (sql, params)


def _row(url: str, seq: int) -> StoredRow:
    with raw(url) as conn:
        found = conn.execute("SELECT id, stream, seq, type, data, meta, recorded_at, prev_hash, hash "
                             "FROM jixu_events WHERE stream = %s AND seq = %s", (STREAM, seq)).fetchone()
    assert found is not None
    return StoredRow(*found)


def _set(column: str, value: object, seq: int) -> tuple[str, tuple[object, ...]]:
    return (f"UPDATE jixu_events SET {column} = %s WHERE stream = %s AND seq = %s", (value, STREAM, seq))


def _verify(url: str) -> VerifyReport:
    with PostgresStore(url) as store:
        assert store.verify("tamper/other").valid
        return store.verify(STREAM)


def _assert_bad(report: VerifyReport, seq: int, reason: str) -> None:
    assert not report.valid, report
    assert (report.first_bad_seq, report.reason) == (seq, reason), report
    assert report.count == seq - 1 and report.detail, report


def test_the_untampered_ledger_verifies(ledger: str) -> None:
    report = _verify(ledger)
    assert report.valid and report.count == N and report.head_hash == _row(ledger, N).hash


@pytest.mark.parametrize("seq", [1, 10, N])
def test_a_changed_payload_is_payload_changed_at_that_seq(ledger: str, seq: int) -> None:
    original = _row(ledger, seq).data_json
    _tamper(ledger, _set("data", original.replace(f'"amount":{1000 + seq}', f'"amount":{2000 + seq}'), seq))
    _assert_bad(_verify(ledger), seq, "payload_changed")


@pytest.mark.parametrize(("low", "high"), [(1, 2), (5, 15), (N - 1, N)])
def test_swapped_events_are_reordered_at_the_lower_seq(ledger: str, low: int, high: int) -> None:
    sql = "UPDATE jixu_events SET seq = %s WHERE stream = %s AND seq = %s"
    _tamper(ledger, (sql, (1_000_000, STREAM, low)), (sql, (low, STREAM, high)), (sql, (high, STREAM, 1_000_000)))
    _assert_bad(_verify(ledger), low, "reordered")


@pytest.mark.parametrize("seq", [1, 10, N])
def test_a_deleted_event_is_a_gap(ledger: str, seq: int) -> None:
    _tamper(ledger, ("DELETE FROM jixu_events WHERE stream = %s AND seq = %s", (STREAM, seq)))
    _assert_bad(_verify(ledger), seq, "gap")


@pytest.mark.parametrize("seq", [1, 10, N])
def test_an_altered_prev_hash_is_a_bad_link(ledger: str, seq: int) -> None:
    _tamper(ledger, _set("prev_hash", hashlib.sha256(b"forged link").hexdigest(), seq))
    _assert_bad(_verify(ledger), seq, "bad_link")


def test_a_forged_event_with_its_hash_recomputed_breaks_the_next_link(ledger: str) -> None:
    row = _row(ledger, 10)
    forged = replace(row, data_json='{"forged":true}')
    _tamper(ledger, _set("data", forged.data_json, 10), _set("hash", row_hash(forged), 10))
    _assert_bad(_verify(ledger), 11, "bad_link")


def test_an_altered_head_record_is_head_mismatch(ledger: str) -> None:
    _tamper(ledger, ("UPDATE jixu_streams SET head_hash = %s WHERE stream = %s",
                     (hashlib.sha256(b"other head").hexdigest(), STREAM)))
    report = _verify(ledger)
    assert not report.valid and (report.first_bad_seq, report.reason) == (N, "head_mismatch"), report


def test_events_without_a_head_record_are_reported_and_appends_fail_clearly(ledger: str) -> None:
    _tamper(ledger, ("DELETE FROM jixu_streams WHERE stream = %s", (STREAM,)))
    with PostgresStore(ledger) as store:
        report = store.verify(STREAM)
        assert (report.valid, report.reason, report.first_bad_seq) == (False, "head_mismatch", 1)
        with pytest.raises(StoreError, match="disagree"):
            store.append(STREAM, steps(1), 0)


@pytest.mark.parametrize("dsn", ["postgresql://jixu@h/db?passwor%64=s3cr3t-Pa55&sslmode=off",
                                 "postgresql://jixu@h/db?sslmode=off&Password=s3cr3t-Pa55#frag",
                                 "postgresql://jixu@h/db?sslmode=off&password=s3cr3t#Pa55"])
def test_a_password_parameter_is_masked_however_its_name_is_spelt(dsn: str) -> None:
    masked = mask_dsn(dsn)
    assert "s3cr3t" not in masked and "Pa55" not in masked and "=***" in masked, masked
    assert "sslmode=off" in masked and masked.startswith("postgresql://jixu@h/db?"), masked


@pytest.mark.parametrize("dsn", ["postgresql://jixu:s3cr#Pa55@/db?host=/tmp", "postgresql://jixu:s3cr?Pa55@h/db",
                                 "host=h password=s3cr\\ Pa55 dbname=db"])
def test_a_password_with_what_libpq_takes_literally_is_masked_whole(dsn: str) -> None:
    """Seen by an audit: libpq ends a URL's user part only at "@" or "/" ("#" and "?" are part of it) and escapes
    with a backslash in key=value values; the masking stopped earlier and printed the rest."""
    masked = mask_dsn(dsn)
    assert "s3cr" not in masked and "Pa55" not in masked and "***" in masked, masked
