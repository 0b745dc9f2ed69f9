"""``Store.opened_again``: the same database, opened as the store was, after the store was closed (decision 0065:
a claim held while a call ran on is given back when it ends, the holder's store closed or not)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jixu.ledger import NewEvent, SQLiteStore, Store


def test_a_closed_store_opened_again_reaches_the_same_database(store_factory: object) -> None:
    store: Store = store_factory()  # type: ignore[operator]
    store.append("again/1", [NewEvent("a.b")], 0)
    store.close()
    with store.opened_again() as again:
        assert [event.type for event in again.read("again/1")] == ["a.b"]
        again.append("again/1", [NewEvent("a.c")], 1)


def test_a_sqlite_store_opened_by_a_relative_path_is_opened_again_after_a_change_of_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with SQLiteStore("relative.db", synchronous="NORMAL", busy_timeout=3) as store:
        store.append("r/1", [NewEvent("a.b")], 0)
    (tmp_path / "elsewhere").mkdir()
    os.chdir(tmp_path / "elsewhere")
    with store.opened_again() as again:
        assert isinstance(again, SQLiteStore) and again.synchronous == "NORMAL"
        assert len(again.read("r/1")) == 1
    assert not (tmp_path / "elsewhere" / "relative.db").exists()
