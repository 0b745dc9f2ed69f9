"""The store's sessions, credential-use notes and project index, on every backend (memory, SQLite, PostgreSQL),
and the migration that adds them to a store made before them (its thread streams indexed by their project)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

import jixu.ledger.postgres as postgres_module
import jixu.ledger.sqlite as sqlite_module
from jixu.errors import InvalidInput
from jixu.ledger import NewEvent, SQLiteStore, Store
from jixu.ledger.store import AppendRequest, group_of_meta
from tests.conftest import PostgresSchema


def test_a_session_is_active_until_it_is_revoked_or_expires(store: Store) -> None:
    made = store.create_session("s1", "token-a", 60)
    assert made.active and made.subject == "token-a" and made.expires_at - made.created_at == pytest.approx(60)
    found = store.get_session("s1")
    assert found is not None and found.active and found.revoked_at is None
    assert store.get_session("nope") is None
    with pytest.raises(InvalidInput, match="exists already"):
        store.create_session("s1", "token-b", 60)
    assert store.revoke_session("s1") is True
    assert store.revoke_session("s1") is False  # ended already
    ended = store.get_session("s1")
    assert ended is not None and not ended.active and ended.revoked_at is not None
    store.create_session("short", "token-a", 0.05)
    time.sleep(0.1)
    expired = store.get_session("short")
    assert expired is not None and not expired.active and expired.revoked_at is None
    assert store.revoke_session("short") is False


def test_every_session_of_a_subject_ends_at_once_and_only_those(store: Store) -> None:
    for key in ("a1", "a2", "a3"):
        store.create_session(key, "token-a", 60)
    store.create_session("b1", "token-b", 60)
    store.revoke_session("a3")
    assert store.revoke_sessions("token-a") == 2
    assert [store.get_session(k).active for k in ("a1", "a2", "a3", "b1")] == [False, False, False, True]  # type: ignore[union-attr]
    assert store.revoke_sessions("token-a") == 0


def test_a_second_connection_sees_the_sessions_of_the_first(store_factory: object) -> None:
    first = store_factory()  # type: ignore[operator]
    second = store_factory()  # type: ignore[operator]
    first.create_session("shared", "token-a", 60)
    assert second.get_session("shared").active
    second.revoke_sessions("token-a")
    assert not first.get_session("shared").active


def test_credential_use_keeps_the_latest_time_by_the_store_clock(store: Store) -> None:
    assert store.last_used(["t1"]) == {}
    store.record_use("t1")
    first = store.last_used(["t1", "t2"])
    assert list(first) == ["t1"] and abs(first["t1"] - store.now()) < 5
    time.sleep(0.02)
    store.record_use("t1")
    assert store.last_used(["t1"])["t1"] > first["t1"]
    assert store.last_used([]) == {}


def test_bad_session_and_use_arguments_are_typed_errors(store: Store) -> None:
    with pytest.raises(InvalidInput):
        store.create_session("", "token-a", 60)
    with pytest.raises(InvalidInput):
        store.create_session("k", "token-a", 0)
    with pytest.raises(InvalidInput):
        store.last_used("t1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.list_streams("x/", groups="alpha")  # type: ignore[arg-type]


def _stream(store: Store, name: str, project: str | None) -> None:
    meta = {"actor": "test"} if project is None else {"actor": "test", "project": project}
    store.append(name, [NewEvent("x.created", {"n": 1}, meta), NewEvent("x.more", {}, {"project": "later"})], 0)


def test_streams_are_found_by_the_project_their_first_event_names(store: Store) -> None:
    for n in range(5):
        _stream(store, f"thread/{n:02d}", "alpha" if n % 2 == 0 else "beta")
    _stream(store, "thread/09", None)
    _stream(store, "run/01", "alpha")  # another prefix, same project
    info = store.stream_info("thread/00")
    assert info is not None and info.group == "alpha"
    assert store.stream_info("thread/09").group is None  # type: ignore[union-attr]
    names = [i.stream for i in store.list_streams("thread/", groups=["alpha"])]
    assert names == ["thread/00", "thread/02", "thread/04"]
    both = [i.stream for i in store.list_streams("thread/", groups=["beta", "alpha", "alpha"])]
    assert both == [f"thread/{n:02d}" for n in range(5)]
    paged = store.list_streams("thread/", groups=["alpha", "beta"], after="thread/01", limit=2)
    assert [i.stream for i in paged] == ["thread/02", "thread/03"]
    assert store.list_streams("thread/", groups=[]) == []
    assert store.list_streams("thread/", groups=["gamma"]) == []
    assert [i.stream for i in store.list_streams("", groups=["alpha"])] == ["run/01", "thread/00", "thread/02",
                                                                               "thread/04"]


def test_streams_appended_together_in_one_group_are_indexed_too(store: Store) -> None:
    store.append_many([AppendRequest(f"thread/g{n}", [NewEvent("x.created", {}, {"project": "alpha"})], 0)
                       for n in range(4)])
    assert len(store.list_streams("thread/", groups=["alpha"])) == 4


def test_only_a_string_of_one_to_a_hundred_characters_is_a_project() -> None:
    assert group_of_meta('{"actor":"a"}') is None
    assert group_of_meta('{"project":"alpha"}') == "alpha"
    assert group_of_meta('{"project":5}') is None
    assert group_of_meta('{"project":""}') is None
    assert group_of_meta('{"project":"' + "p" * 101 + '"}') is None


# --- the migration ---------------------------------------------------------------------------------------------


def _legacy_threads(store: Store) -> None:
    """Thread streams as jixu recorded them before the index: the project in the first event's data.metadata."""
    store.append("thread/01", [NewEvent("thread.created", {"metadata": {"project": "alpha"}}, {"actor": "a"})], 0)
    store.append("thread/02", [NewEvent("thread.created", {"metadata": {}}, {"actor": "a"})], 0)
    store.append("thread/03", [NewEvent("thread.created", {"metadata": {"project": 7}}, {"actor": "a"})], 0)
    store.append("thread/04", [NewEvent("thread.forked", {"metadata": {"project": "beta"}}, {"actor": "a"})], 0)
    store.append("run/01", [NewEvent("run.created", {"metadata": {"project": "alpha"}}, {"actor": "a"})], 0)


def _check_backfilled(store: Store) -> None:
    projects = {i.stream: i.group for i in store.list_streams()}
    assert projects == {"run/01": None, "thread/01": "alpha", "thread/02": "default", "thread/03": None,
                        "thread/04": "beta"}
    assert [i.stream for i in store.list_streams("thread/", groups=["alpha", "default"])] == ["thread/01",
                                                                                                 "thread/02"]
    store.create_session("after-upgrade", "token-a", 60)
    assert store.get_session("after-upgrade").active  # type: ignore[union-attr]


def test_a_sqlite_store_of_schema_2_is_upgraded_and_its_threads_indexed(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with SQLiteStore(path) as made:
        _legacy_threads(made)
    with sqlite3.connect(path) as conn:  # back to schema 2: what migration 3 adds, removed
        for statement in ("DROP INDEX jixu_streams_project", "ALTER TABLE jixu_streams DROP COLUMN project",
                          "DROP TABLE jixu_sessions", "DROP TABLE jixu_last_used",
                          "DELETE FROM jixu_schema WHERE version = 3"):
            conn.execute(statement)
    with SQLiteStore(path) as store:
        assert store.schema_version() == sqlite_module.SCHEMA_VERSION == 3
        _check_backfilled(store)
        assert store.verify("thread/01").valid


def test_a_postgres_store_of_schema_4_is_upgraded_and_its_threads_indexed(postgres_dsn: str) -> None:
    import psycopg

    from jixu.ledger import PostgresStore

    schema = PostgresSchema(postgres_dsn)
    try:
        with PostgresStore(schema.url) as made:
            _legacy_threads(made)
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # back to schema 4
            conn.execute(f"SET search_path = {schema.name}")
            for statement in ("DROP TRIGGER jixu_streams_project ON jixu_streams",
                              "DROP FUNCTION jixu_streams_project()", "DROP FUNCTION jixu_project_of(text)",
                              "ALTER TABLE jixu_streams DROP COLUMN project", "DROP TABLE jixu_sessions",
                              "DROP TABLE jixu_last_used", "DROP FUNCTION jixu_append_many_v6",
                              "DELETE FROM jixu_schema WHERE version >= 5"):
                conn.execute(statement)
        with PostgresStore(schema.url) as store:
            assert store.schema_version() == postgres_module.SCHEMA_VERSION == 6
            _check_backfilled(store)
            _stream(store, "thread/05", "alpha")  # after the upgrade: the trigger indexes a new stream
            assert store.stream_info("thread/05").group == "alpha"  # type: ignore[union-attr]
            assert store.verify("thread/01").valid
            # and a group commit goes through migration 6's function
            answers = store.append_many([AppendRequest(f"thread/6{n}", [NewEvent("x.created", {})], 0)
                                         for n in range(3)])
            assert [[e.seq for e in a] for a in answers] == [[1], [1], [1]]  # type: ignore[union-attr]
    finally:
        schema.drop()
