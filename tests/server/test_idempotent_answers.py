"""A request id's recorded answer may be larger than one event: it is kept as an artifact.

Seen by an audit: ``POST .../effects/{id}/resolve`` with an ``Idempotency-Key`` and a ``result`` just under the
body limit: the resolution was recorded, but the answer (the result again, plus the effect and the thread's
summary) did not fit one event, so the server answered 413 for a mutation it had made, and every retry with the
key answered 409 ``request_in_progress`` for good.
"""

from __future__ import annotations

from pathlib import Path

from jixu.ledger import NewEvent, SQLiteStore
from jixu.server.idempotency import Outcome, request_stream, run_once


def test_an_answer_too_large_for_one_event_is_recorded_and_replayed(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "ids.db") as store:
        done: list[int] = []
        answer = {"result": "x" * 1_048_560, "effect": {"state": "completed"}}

        def operation() -> Outcome:
            store.append("thread/changed", [NewEvent("a.changed", {"n": len(done)})], len(done))
            done.append(1)
            return Outcome(200, answer)

        first = run_once(store, "token1", "key-1", method="POST", path="/resolve", body={"r": 1}, actor="op",
                         operation=operation)
        assert (first.status, first.body, first.replayed) == (200, answer, False)
        again = run_once(store, "token1", "key-1", method="POST", path="/resolve", body={"r": 1}, actor="op",
                         operation=operation)
        assert (again.status, again.body, again.replayed) == (200, answer, True)
        assert done == [1]
        assert [e.type for e in store.read(request_stream("token1", "key-1"))] == [
            "idempotency.started", "idempotency.answered"]


def test_an_answer_whose_artifact_is_lost_is_refused_as_such_and_not_run_again(tmp_path: Path) -> None:
    """Its stored answer deleted (raw SQL) or altered: a replay is a 409 saying the request was made and its
    answer cannot be read, never a 404 about an artifact, and the operation does not run again."""
    import sqlite3

    import pytest

    from jixu.errors import StreamCorrupt

    path = tmp_path / "ids.db"
    with SQLiteStore(path) as store:
        done: list[int] = []

        def operation() -> Outcome:
            done.append(1)
            return Outcome(200, {"result": "x" * 1_048_560})

        run_once(store, "token1", "key-1", method="POST", path="/resolve", body={"r": 1}, actor="op",
                 operation=operation)
        with sqlite3.connect(path) as sql:
            for trigger, in sql.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
                sql.execute(f'DROP TRIGGER "{trigger}"')
            sql.execute("DELETE FROM jixu_events WHERE stream LIKE 'artifact/%'")
            sql.execute("DELETE FROM jixu_streams WHERE stream LIKE 'artifact/%'")
        with pytest.raises(StreamCorrupt, match="was answered, but its stored answer cannot be read"):
            run_once(store, "token1", "key-1", method="POST", path="/resolve", body={"r": 1}, actor="op",
                     operation=operation)
        assert done == [1]
