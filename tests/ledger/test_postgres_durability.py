"""PostgreSQL commits are durable whatever the server says (decision 0023).

Every pooled connection runs with ``synchronous_commit = on`` (``remote_apply``
is kept: it is stronger) whatever the server, database or role set, and a
writable store refuses a server running with ``fsync = off`` unless told to
accept the risk. These tests change server-wide settings, so they run on a
throwaway server of their own, never on the session's.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest

from jixu.errors import InvalidInput, StoreNotDurable
from jixu.ledger import NewEvent, PostgresStore, open_store
from jixu.ledger.urls import postgres_dsn_and_options
from tests.conftest import start_reaper
from tests.helpers import python_env


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The admin URL of a PostgreSQL server for this module alone (its settings are changed)."""
    data_dir = tempfile.mkdtemp(prefix="jixu-pg-durability-")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import pgserver

        started = pgserver.get_server(data_dir, cleanup_mode="stop")
    reaper = start_reaper(data_dir)
    try:
        yield str(started.get_uri())
    finally:
        started.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)
        assert reaper.stdin is not None
        reaper.stdin.close()
        reaper.wait(timeout=30)


def raw(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def with_database(url: str, name: str, user: str | None = None) -> str:
    """``url`` pointed at database ``name`` (as ``user`` when given)."""
    parts = urlsplit(url)
    netloc = f"{user}@{parts.netloc.rpartition('@')[2]}" if user else parts.netloc
    return urlunsplit((parts.scheme, netloc, f"/{name}", parts.query, parts.fragment))


@pytest.fixture
def database(server: str) -> Iterator[str]:
    """A fresh database on the module's server; its URL."""
    name = f"jixu_durability_{time.time_ns()}"
    with raw(server) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield with_database(server, name)
    finally:
        with raw(server) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def with_query(url: str, *params: str) -> str:
    """``url`` with ``params`` (``name=value``) added to its query."""
    return f"{url}{'&' if '?' in url else '?'}{'&'.join(params)}"


def show(conn: psycopg.Connection[Any], setting: str) -> str:
    row = conn.execute(f"SHOW {setting}").fetchone()
    assert row is not None
    return str(row[0])


def pooled_settings(store: PostgresStore, setting: str) -> list[str]:
    """``setting`` as each of the store's pooled connections sees it (all of them checked out at once)."""
    conns = [store._pool.getconn() for _ in range(store._pool.max_size)]
    try:
        return [show(conn, setting) for conn in conns]
    finally:
        for conn in conns:
            store._pool.putconn(conn)


def _reload_until(server: str, setting: str, expected: str) -> None:
    """Reload the server's configuration and wait until a new session sees ``setting`` = ``expected``."""
    with raw(server) as conn:
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 10
    while True:
        with raw(server) as fresh:  # a session started after the reload reached the postmaster
            now = show(fresh, setting)
        if now == expected:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{setting} is {now}, not {expected}, after a reload")
        time.sleep(0.05)


@contextlib.contextmanager
def server_setting(server: str, setting: str, value: str) -> Iterator[None]:
    """``ALTER SYSTEM SET setting = value`` for the block; reset afterwards."""
    with raw(server) as conn:
        before = show(conn, setting)
        conn.execute(f"ALTER SYSTEM SET {setting} = {value}")
    try:
        _reload_until(server, setting, value)
        yield
    finally:
        with raw(server) as conn:
            conn.execute(f"ALTER SYSTEM RESET {setting}")
        _reload_until(server, setting, before)


def test_the_stores_connections_commit_synchronously_whatever_the_database_says(database: str) -> None:
    with raw(database) as conn:
        conn.execute(f"ALTER DATABASE {urlsplit(database).path[1:]} SET synchronous_commit = off")
    with raw(database) as plain:
        assert show(plain, "synchronous_commit") == "off"  # what any other session of this database gets
    with PostgresStore(database, min_size=2, max_size=3) as store:
        assert pooled_settings(store, "synchronous_commit") == ["on", "on", "on"]
        assert store._run(lambda conn: show(conn, "synchronous_commit")) == "on"
        assert store.durability == "synchronous_commit=on, fsync=on"
        store.append("d/1", [NewEvent("a.b")], 0)
        assert store.verify("d/1").valid


def test_the_stores_connections_read_committed_whatever_the_database_says(database: str) -> None:
    """Seen by an audit: with the database's default at REPEATABLE READ, a work claim counted the live claims in a
    snapshot taken before it waited for the claimers' lock, so two workers both claimed under a global limit of 1.
    The store's connections run READ COMMITTED, what its statements are written for."""
    import threading

    from jixu.ledger.postgres import _WORK_LOCK
    from jixu.scheduling.queue import claim

    with raw(database) as conn:
        conn.execute(f"ALTER DATABASE {urlsplit(database).path[1:]} SET default_transaction_isolation = "
                     "'repeatable read'")
    with raw(database) as plain:
        assert show(plain, "transaction_isolation") == "repeatable read"
    with PostgresStore(database, min_size=2, max_size=3) as a, PostgresStore(database) as b, \
            PostgresStore(database) as setup, raw(database) as holder:
        assert pooled_settings(a, "transaction_isolation") == ["read committed"] * 3
        setup.enqueue("work/Y", "Q", ready_at=setup.now() + 1.5)  # ready while the claimers wait
        holder.execute(f"SELECT pg_advisory_lock({_WORK_LOCK})")  # a third claimer holds the claim lock
        got: dict[str, object] = {}

        def claimer(tag: str, store: PostgresStore) -> None:
            got[tag] = claim(store, owner=f"worker-{tag}", ttl=60, global_limit=1)

        def waiting() -> int:
            row = holder.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            return int(row.fetchone()[0])  # type: ignore[index]

        second = threading.Thread(target=claimer, args=("B", b))
        second.start()
        deadline = time.monotonic() + 10
        while waiting() < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        setup.enqueue("work/X", "P")
        first = threading.Thread(target=claimer, args=("A", a))
        first.start()
        while waiting() < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(2.0)  # work/Y is ready now
        holder.execute(f"SELECT pg_advisory_unlock({_WORK_LOCK})")
        first.join(30)
        second.join(30)
        assert len(setup.list_work(state="claimed")) == 1, got


def test_the_stores_connections_commit_synchronously_whatever_the_role_or_server_says(
    server: str, database: str,
) -> None:
    name = urlsplit(database).path[1:]
    with raw(database) as conn:
        conn.execute("CREATE ROLE jixu_lazy LOGIN")
        conn.execute("ALTER ROLE jixu_lazy SET synchronous_commit = off")
        conn.execute(f"ALTER DATABASE {name} OWNER TO jixu_lazy")
        conn.execute("ALTER SCHEMA public OWNER TO jixu_lazy")
    as_role = with_database(server, name, user="jixu_lazy")
    try:
        with raw(as_role) as plain:
            assert show(plain, "synchronous_commit") == "off"
        with PostgresStore(as_role, max_size=2) as store:
            assert pooled_settings(store, "synchronous_commit") == ["on", "on"]
            assert store.append("r/1", [NewEvent("a.b")], 0)[0].seq == 1
        with server_setting(server, "synchronous_commit", "off"):
            with raw(database) as plain:
                assert show(plain, "synchronous_commit") == "off"
            with PostgresStore(database, max_size=2) as store:
                assert pooled_settings(store, "synchronous_commit") == ["on", "on"]
    finally:
        with raw(server) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute("DROP ROLE IF EXISTS jixu_lazy")


def test_a_stronger_synchronous_commit_is_kept(database: str) -> None:
    with raw(database) as conn:
        conn.execute(f"ALTER DATABASE {urlsplit(database).path[1:]} SET synchronous_commit = remote_apply")
    with PostgresStore(database, max_size=2) as store:
        assert pooled_settings(store, "synchronous_commit") == ["remote_apply", "remote_apply"]
        assert store.durability == "synchronous_commit=remote_apply, fsync=on"


def _jixu_tables(url: str) -> list[str]:
    with raw(url) as conn:
        return [str(r[0]) for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'jixu%%' ORDER BY 1").fetchall()]


def test_a_server_with_fsync_off_is_refused_unless_the_store_accepts_the_risk(server: str, database: str) -> None:
    with server_setting(server, "fsync", "off"):
        with pytest.raises(StoreNotDurable, match=r"fsync = off.*allow_unsafe_durability=True") as info:
            PostgresStore(database)
        assert info.value.code == "store_not_durable"
        with pytest.raises(StoreNotDurable):
            open_store(with_query(database, "allow_unsafe_durability=false"))
        assert _jixu_tables(database) == []  # refused before the schema was installed
        with PostgresStore(database, allow_unsafe_durability=True) as store:
            assert store.durability == "synchronous_commit=on, fsync=off (unsafe: allowed by allow_unsafe_durability)"
            assert store.append("u/1", [NewEvent("a.b")], 0)[0].seq == 1
        search = quote("-csearch_path=public", safe="")
        with open_store(with_query(database, f"options={search}", "allow_unsafe_durability=true")) as opened:
            assert isinstance(opened, PostgresStore) and "fsync=off" in opened.durability
            assert "allow_unsafe_durability=true" in opened.url and len(opened.read("u/1")) == 1
        with pytest.raises(StoreNotDurable):  # a keyword wins over the URL
            PostgresStore(with_query(database, "allow_unsafe_durability=true"), allow_unsafe_durability=False)
        with PostgresStore(database, read_only=True) as reader:  # commits nothing: nothing to lose
            assert "read-only" in reader.durability and len(reader.read("u/1")) == 1
        # The opt-down is on the start line of a worker (and of `jixu serve`, tests/cli): seen by an audit, only the
        # URL's parameter said it, and nothing at all when given by keyword.
        started = subprocess.run(
            [sys.executable, "-m", "jixu", "worker", "--store", with_query(database, "allow_unsafe_durability=true"),
             "--providers", "jixu.cli.studio:fixture_providers", "--exit-when-idle"],
            capture_output=True, text=True, env=python_env(), timeout=120, check=False)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "(durability synchronous_commit=on, fsync=off (unsafe: allowed by allow_unsafe_durability))" in \
            started.stdout + started.stderr
    with PostgresStore(database) as store:
        assert store.durability == "synchronous_commit=on, fsync=on"


def test_jixus_url_options_are_taken_out_and_everything_else_is_kept_byte_for_byte() -> None:
    base = "postgresql://u:p%40ss@h:5432/db"
    assert postgres_dsn_and_options(base) == (base, {})
    assert postgres_dsn_and_options(f"{base}?allow_unsafe_durability=true") == (
        base, {"allow_unsafe_durability": True})
    assert postgres_dsn_and_options(f"{base}?sslmode=require&allow_unsafe_durability=0&options=-c%20x%3Dy") == (
        f"{base}?sslmode=require&options=-c%20x%3Dy", {"allow_unsafe_durability": False})
    assert postgres_dsn_and_options("postgres://h/db?allow_unsafe_durability=yes#f") == (
        "postgres://h/db#f", {"allow_unsafe_durability": True})
    assert postgres_dsn_and_options("host=h dbname=db") == ("host=h dbname=db", {})
    with pytest.raises(InvalidInput, match="allow_unsafe_durability"):
        postgres_dsn_and_options(f"{base}?allow_unsafe_durability=perhaps")
