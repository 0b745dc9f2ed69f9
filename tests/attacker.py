"""An attacker with write access to the database: raw SQL on a real SQLite file or PostgreSQL schema.

Nothing here goes through jixu's stores: it opens the database itself, drops
the immutability triggers first (as anybody holding the file or a superuser
could), and changes events, stream heads and checkpoints. The seven kinds of
event tampering of issue 22 are in :data:`KINDS`; :func:`forge_checkpoint`
edits a checkpoint's state, with its digest kept (naive) or recomputed with
the public, unkeyed formula (the best anybody without the key can do).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jixu.ledger.chain import row_hash
from jixu.ledger.encoding import canonical_text
from jixu.ledger.event import StoredRow

TEMP_SEQ = 1_000_000


class Raw:
    """One database, as raw SQL: ``target`` is a SQLite path or a ``postgresql://`` URL (with its schema)."""

    def __init__(self, target: str | Path) -> None:
        self.target = str(target)
        self.postgres = self.target.startswith(("postgresql://", "postgres://"))

    @contextmanager
    def transaction(self) -> Iterator[Callable[..., list[tuple[Any, ...]]]]:
        """A transaction with the immutability triggers dropped; yields ``run(sql, *params)``."""
        if self.postgres:
            import psycopg

            with psycopg.connect(self.target) as conn:
                def run_pg(sql: str, *params: Any) -> list[tuple[Any, ...]]:
                    cursor = conn.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]
                    return list(cursor.fetchall()) if cursor.description else []

                run_pg("DROP TRIGGER IF EXISTS jixu_events_no_update ON jixu_events")
                run_pg("DROP TRIGGER IF EXISTS jixu_events_no_delete ON jixu_events")
                yield run_pg
            return
        conn = sqlite3.connect(self.target, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DROP TRIGGER IF EXISTS jixu_events_no_update")
            conn.execute("DROP TRIGGER IF EXISTS jixu_events_no_delete")

            def run_sqlite(sql: str, *params: Any) -> list[tuple[Any, ...]]:
                return list(conn.execute(sql, params).fetchall())

            yield run_sqlite
            conn.execute("COMMIT")
        finally:
            conn.close()

    def row(self, stream: str, seq: int) -> StoredRow:
        with self.transaction() as run:
            found = run("SELECT id, stream, seq, type, data, meta, recorded_at, prev_hash, hash FROM jixu_events "
                        "WHERE stream = ? AND seq = ?", stream, seq)
        assert found, f"no event {stream} #{seq}"
        return StoredRow(*found[0])

    def head(self, stream: str) -> int:
        with self.transaction() as run:
            return int(run("SELECT head_seq FROM jixu_streams WHERE stream = ?", stream)[0][0])

    def checkpoint(self, stream: str, name: str) -> dict[str, Any] | None:
        with self.transaction() as run:
            found = run("SELECT seq, reducer_version, head_hash, state, digest FROM jixu_checkpoints "
                        "WHERE stream = ? AND name = ?", stream, name)
        if not found:
            return None
        seq, version, head_hash, state, digest = found[0]
        return {"seq": int(seq), "reducer_version": int(version), "head_hash": head_hash, "state": state,
                "digest": digest}

    def checkpoints(self, stream: str) -> list[str]:
        with self.transaction() as run:
            return [name for (name,) in run("SELECT name FROM jixu_checkpoints WHERE stream = ?", stream)]


# --- the seven kinds of event tampering ---------------------------------------------------------------


def _flip_digit(text: str) -> str:
    """``text`` with exactly one byte changed: the last digit in it, else the last letter, is replaced."""
    for index in range(len(text) - 1, -1, -1):
        char = text[index]
        if char.isdigit():
            return text[:index] + str((int(char) + 1) % 10) + text[index + 1:]
    for index in range(len(text) - 1, -1, -1):
        char = text[index]
        if char.isalpha() and char.isascii():
            return text[:index] + ("b" if char != "b" else "c") + text[index + 1:]
    raise AssertionError(f"nothing to flip in {text!r}")


def flip_data_byte(raw: Raw, stream: str, seq: int) -> None:
    row = raw.row(stream, seq)
    with raw.transaction() as run:
        run("UPDATE jixu_events SET data = ? WHERE stream = ? AND seq = ?", _flip_digit(row.data_json), stream, seq)


def swap_events(raw: Raw, stream: str, seq: int) -> None:
    """Swap the events at ``seq`` and ``seq + 1``."""
    with raw.transaction() as run:
        sql = "UPDATE jixu_events SET seq = ? WHERE stream = ? AND seq = ?"
        run(sql, TEMP_SEQ, stream, seq)
        run(sql, seq, stream, seq + 1)
        run(sql, seq + 1, stream, TEMP_SEQ)


def delete_event(raw: Raw, stream: str, seq: int) -> None:
    with raw.transaction() as run:
        run("DELETE FROM jixu_events WHERE stream = ? AND seq = ?", stream, seq)


def relink_event(raw: Raw, stream: str, seq: int) -> None:
    """Point the event at ``seq`` to another predecessor (the genesis, or the event two before) and give it the
    hash of its new content, so only its link is wrong."""
    row = raw.row(stream, seq)
    other = raw.row(stream, seq - 2).hash if seq > 2 else "1" * 64
    relinked = StoredRow(row.id, row.stream, row.seq, row.type, row.data_json, row.meta_json, row.recorded_at,
                         other, "")
    with raw.transaction() as run:
        run("UPDATE jixu_events SET prev_hash = ?, hash = ? WHERE stream = ? AND seq = ?", other,
            row_hash(relinked), stream, seq)


def change_recorded_at(raw: Raw, stream: str, seq: int) -> None:
    with raw.transaction() as run:
        run("UPDATE jixu_events SET recorded_at = ? WHERE stream = ? AND seq = ?", "2001-01-01T00:00:00.000000Z",
            stream, seq)


def change_actor(raw: Raw, stream: str, seq: int) -> None:
    row = raw.row(stream, seq)
    meta = json.loads(row.meta_json)
    meta["actor"] = "mallory"
    with raw.transaction() as run:
        run("UPDATE jixu_events SET meta = ? WHERE stream = ? AND seq = ?", canonical_text(meta), stream, seq)


def change_last_event(raw: Raw, stream: str, seq: int) -> None:
    """Flip a byte of the last event's data (``seq`` is ignored: the head is what is changed)."""
    flip_data_byte(raw, stream, raw.head(stream))


KINDS: dict[str, tuple[Callable[[Raw, str, int], None], str]] = {
    "data_byte": (flip_data_byte, "payload_changed"),
    "swap": (swap_events, "reordered"),
    "delete": (delete_event, "gap"),
    "relink": (relink_event, "reordered"),
    "recorded_at": (change_recorded_at, "payload_changed"),
    "actor": (change_actor, "payload_changed"),
    "last_event": (change_last_event, "payload_changed"),
}
"""Each kind of issue 22 and the reason ``verify`` names for it."""


def rewrite_from(raw: Raw, stream: str, seq: int) -> None:
    """Change the event at ``seq`` and recompute every hash from there to the head, and the head record: a
    chain that verifies (the whole-history rewrite nothing but an outside anchor can reveal)."""
    head = raw.head(stream)
    rows = [raw.row(stream, s) for s in range(seq, head + 1)]
    prev = raw.row(stream, seq - 1).hash if seq > 1 else rows[0].prev_hash
    with raw.transaction() as run:
        for index, row in enumerate(rows):
            data = _flip_digit(row.data_json) if index == 0 else row.data_json
            changed = StoredRow(row.id, row.stream, row.seq, row.type, data, row.meta_json, row.recorded_at, prev, "")
            new_hash = row_hash(changed)
            run("UPDATE jixu_events SET data = ?, prev_hash = ?, hash = ? WHERE stream = ? AND seq = ?", data, prev,
                new_hash, stream, row.seq)
            prev = new_hash
        run("UPDATE jixu_streams SET head_hash = ? WHERE stream = ?", prev, stream)


# --- checkpoints ----------------------------------------------------------------------------------------


def public_digest(stream: str, name: str, seq: int, reducer_version: int, head_hash: str, state: str) -> str:
    """The unkeyed checkpoint digest anybody can compute (jixu's v2 formula): what a forger can store."""
    header = canonical_text({"stream": stream, "name": name, "seq": seq, "reducer_version": reducer_version,
                             "head_hash": head_hash})
    digest = hashlib.sha256(b"jixu.checkpoint.v2\x00")
    digest.update(header.encode("utf-8"))
    digest.update(b"\x00")
    digest.update(state.encode("utf-8"))
    return digest.hexdigest()


def forge_checkpoint(raw: Raw, stream: str, name: str, edit: Callable[[str], str], *, recompute: bool) -> None:
    """Edit a checkpoint's state text with ``edit``; keep its digest (naive) or store the public digest of the
    edited fields (``recompute``)."""
    found = raw.checkpoint(stream, name)
    assert found is not None, f"no checkpoint {name!r} of {stream}"
    state = edit(found["state"])
    assert state != found["state"], "the edit changed nothing"
    digest = public_digest(stream, name, found["seq"], found["reducer_version"], found["head_hash"],
                           state) if recompute else found["digest"]
    with raw.transaction() as run:
        run("UPDATE jixu_checkpoints SET state = ?, digest = ? WHERE stream = ? AND name = ?", state, digest, stream,
            name)


__all__ = ["KINDS", "Raw", "forge_checkpoint", "public_digest", "rewrite_from"]
