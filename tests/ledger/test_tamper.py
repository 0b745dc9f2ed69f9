"""Tampering with a real SQLite ledger file is found by ``verify``, at the right seq, for the right reason.

Each test builds a 20-event stream, closes the store, opens the file with a raw
``sqlite3`` connection, drops the two immutability triggers (as an attacker with
file access could), changes something, and reopens a :class:`SQLiteStore`
(which does not recreate the triggers: the schema version is current).
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from jixu.ledger.chain import VerifyReport, row_hash
from jixu.ledger.event import NewEvent, StoredRow
from jixu.ledger.sqlite import SQLiteStore

STREAM = "tamper/1"
OTHER = "tamper/other"
N = 20
TEMP_SEQ = 1_000_000  # a free seq used while swapping two rows (seq must stay >= 1 and unique)

FIRST, MIDDLE, LAST = 1, 10, N
POSITIONS = pytest.mark.parametrize("seq", [FIRST, MIDDLE, LAST], ids=["first", "middle", "last"])

def _data(seq: int) -> dict[str, object]:
    return {"step": seq, "amount": 1000 + seq, "note": f"agent step {seq:04d}", "tags": ["a", "b"]}


def _meta(seq: int) -> dict[str, object]:
    return {"actor": "agent-1", "correlation_id": f"corr-{seq}", "schema": 1}


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """A closed SQLite file holding ``STREAM`` (20 events, appended in batches) and a bystander stream."""
    path = tmp_path / "tamper.db"
    with SQLiteStore(path, synchronous="NORMAL") as store:
        head = 0
        for size in (1, 4, 5, 10):
            events = [NewEvent("agent.step", _data(head + i), _meta(head + i)) for i in range(1, size + 1)]
            head = store.append(STREAM, events, expected_seq=head)[-1].seq
        store.append(OTHER, [NewEvent("agent.step", _data(1), _meta(1))], expected_seq=0)
        assert head == N
    return path


def _tamper(path: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    """Drop the immutability triggers and run ``statements`` in one committed transaction."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("DROP TRIGGER jixu_events_no_update")
        conn.execute("DROP TRIGGER jixu_events_no_delete")
        for sql, params in statements:
            cursor = conn.execute(sql, params)
            assert cursor.rowcount in (-1, 1), f"{sql} {params} changed {cursor.rowcount} rows"
        conn.execute("COMMIT")
    finally:
        conn.close()


def _row(path: Path, seq: int, stream: str = STREAM) -> StoredRow:
    conn = sqlite3.connect(path)
    try:
        found = conn.execute(
            "SELECT id, stream, seq, type, data, meta, recorded_at, prev_hash, hash FROM jixu_events "
            "WHERE stream = ? AND seq = ?",
            (stream, seq),
        ).fetchone()
    finally:
        conn.close()
    assert found is not None, f"no row at seq {seq}"
    return StoredRow(*found)


def _set(column: str, value: object, seq: int) -> tuple[str, tuple[object, ...]]:
    return (f"UPDATE jixu_events SET {column} = ? WHERE stream = ? AND seq = ?", (value, STREAM, seq))


def _swap(low: int, high: int) -> list[tuple[str, tuple[object, ...]]]:
    sql = "UPDATE jixu_events SET seq = ? WHERE stream = ? AND seq = ?"
    return [(sql, (TEMP_SEQ, STREAM, low)), (sql, (low, STREAM, high)), (sql, (high, STREAM, TEMP_SEQ))]


def _verify(path: Path, stream: str = STREAM) -> VerifyReport:
    with SQLiteStore(path) as store:
        return store.verify(stream)


def _assert_bad(report: VerifyReport, seq: int, reason: str) -> None:
    assert not report.valid, report
    assert (report.first_bad_seq, report.reason) == (seq, reason), report
    assert report.detail, report
    assert report.count == seq - 1, report  # events before the first bad one were verified


def _assert_bystander_intact(path: Path) -> None:
    report = _verify(path, OTHER)
    assert report.valid and report.count == 1, report


# --- baseline -------------------------------------------------------------------------------------------


def test_untampered_stream_verifies_valid_with_count_and_last_hash(ledger: Path) -> None:
    with SQLiteStore(ledger) as store:
        events = store.read(STREAM)
        report = store.verify(STREAM)
        info = store.stream_info(STREAM)
    assert [e.seq for e in events] == list(range(1, N + 1))
    assert report.valid and report.first_bad_seq is None and report.reason is None
    assert report.count == N
    assert report.head_hash == events[-1].hash
    assert info is not None and info.head_hash == events[-1].hash and info.head_seq == N


def test_triggers_refuse_update_and_delete_until_dropped(ledger: Path) -> None:
    conn = sqlite3.connect(ledger, isolation_level=None)
    try:
        with pytest.raises(sqlite3.DatabaseError, match="immutable"):
            conn.execute("UPDATE jixu_events SET data = '{}' WHERE stream = ? AND seq = 1", (STREAM,))
        with pytest.raises(sqlite3.DatabaseError, match="immutable"):
            conn.execute("DELETE FROM jixu_events WHERE stream = ? AND seq = 1", (STREAM,))
    finally:
        conn.close()
    assert _verify(ledger).valid


# --- changed content ------------------------------------------------------------------------------------


@POSITIONS
def test_one_changed_byte_in_data_is_payload_changed_at_that_seq(ledger: Path, seq: int) -> None:
    original = _row(ledger, seq).data_json
    needle = f'"amount":{1000 + seq}'
    assert original.count(needle) == 1
    at = original.index(needle) + len(needle) - 1  # the last digit of the amount
    tampered = original[:at] + str((int(original[at]) + 1) % 10) + original[at + 1:]
    assert len(tampered) == len(original)
    assert sum(a != b for a, b in zip(original, tampered, strict=True)) == 1  # exactly one byte differs
    _tamper(ledger, _set("data", tampered, seq))
    _assert_bad(_verify(ledger), seq, "payload_changed")
    _assert_bystander_intact(ledger)


@POSITIONS
def test_changed_meta_text_is_payload_changed_at_that_seq(ledger: Path, seq: int) -> None:
    original = _row(ledger, seq).meta_json
    assert '"actor":"agent-1"' in original
    _tamper(ledger, _set("meta", original.replace('"agent-1"', '"agent-2"'), seq))
    _assert_bad(_verify(ledger), seq, "payload_changed")


@POSITIONS
def test_changed_type_column_is_payload_changed_at_that_seq(ledger: Path, seq: int) -> None:
    _tamper(ledger, _set("type", "agent.skipped", seq))
    _assert_bad(_verify(ledger), seq, "payload_changed")


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("recorded_at", "2001-01-01T00:00:00.000000Z"),
        ("id", "01ARZ3NDEKTSV4RRFFQ69G5FAV"),
        ("hash", hashlib.sha256(b"not the hash").hexdigest()),
    ],
)
def test_other_changed_envelope_column_is_payload_changed_at_that_seq(ledger: Path, column: str, value: str) -> None:
    _tamper(ledger, _set(column, value, MIDDLE))
    _assert_bad(_verify(ledger), MIDDLE, "payload_changed")


# --- order and presence ---------------------------------------------------------------------------------


@pytest.mark.parametrize("low", [FIRST, MIDDLE, LAST - 1], ids=["first", "middle", "last"])
def test_swapped_adjacent_events_are_reordered_at_the_lower_seq(ledger: Path, low: int) -> None:
    _tamper(ledger, *_swap(low, low + 1))
    _assert_bad(_verify(ledger), low, "reordered")


@pytest.mark.parametrize(("low", "high"), [(FIRST, 5), (5, 15), (3, LAST)], ids=["first", "middle", "last"])
def test_swapped_distant_events_are_invalid_at_the_lower_seq(ledger: Path, low: int, high: int) -> None:
    _tamper(ledger, *_swap(low, high))
    report = _verify(ledger)
    _assert_bad(report, low, "reordered")


@pytest.mark.parametrize("seq", [FIRST, MIDDLE, LAST - 1], ids=["first", "middle", "second_to_last"])
def test_deleted_event_is_a_gap_at_that_seq(ledger: Path, seq: int) -> None:
    _tamper(ledger, ("DELETE FROM jixu_events WHERE stream = ? AND seq = ?", (STREAM, seq)))
    _assert_bad(_verify(ledger), seq, "gap")


def test_deleted_last_event_is_a_gap_at_the_recorded_head(ledger: Path) -> None:
    _tamper(ledger, ("DELETE FROM jixu_events WHERE stream = ? AND seq = ?", (STREAM, LAST)))
    report = _verify(ledger)
    _assert_bad(report, LAST, "gap")
    assert report.head_hash == _row(ledger, LAST - 1).hash  # the chain is intact up to the gap


@POSITIONS
def test_altered_prev_hash_is_bad_link_at_that_seq(ledger: Path, seq: int) -> None:
    _tamper(ledger, _set("prev_hash", hashlib.sha256(b"forged link").hexdigest(), seq))
    _assert_bad(_verify(ledger), seq, "bad_link")


# --- forgery and the head record ------------------------------------------------------------------------


@pytest.mark.parametrize("seq", [FIRST, MIDDLE, LAST - 1], ids=["first", "middle", "second_to_last"])
def test_forged_event_with_recomputed_hash_is_bad_link_at_the_next_seq(ledger: Path, seq: int) -> None:
    """A forger who rewrites one event *and* its hash makes that event self-consistent.

    Verification is a hash chain, not a signature: the forged event itself
    passes, and the damage shows only at the next event, whose ``prev_hash``
    still names the original. (Someone who rewrites every later event and the
    stream head too produces a chain that verifies; see the next tests.)
    """
    row = _row(ledger, seq)
    forged = replace(row, data_json=row.data_json.replace('"tags":["a","b"]', '"tags":["a"]'))
    assert forged.data_json != row.data_json
    _tamper(ledger, _set("data", forged.data_json, seq), _set("hash", row_hash(forged), seq))
    _assert_bad(_verify(ledger), seq + 1, "bad_link")


def test_forged_last_event_with_recomputed_hash_is_head_mismatch(ledger: Path) -> None:
    """Forging the last event consistently is caught only by the stream's recorded head hash."""
    row = _row(ledger, LAST)
    forged = replace(row, data_json='{"forged":true}')
    _tamper(ledger, _set("data", forged.data_json, LAST), _set("hash", row_hash(forged), LAST))
    report = _verify(ledger)
    assert not report.valid and (report.first_bad_seq, report.reason) == (LAST, "head_mismatch"), report


def test_recorded_head_hash_altered_is_head_mismatch(ledger: Path) -> None:
    _tamper(ledger, ("UPDATE jixu_streams SET head_hash = ? WHERE stream = ?",
                     (hashlib.sha256(b"other head").hexdigest(), STREAM)))
    report = _verify(ledger)
    assert not report.valid and (report.first_bad_seq, report.reason) == (LAST, "head_mismatch"), report


def test_verification_is_not_a_signature_a_full_consistent_rewrite_verifies(ledger: Path) -> None:
    """Documented limit: rewriting an event, every later link and the head record goes undetected.

    ``verify`` detects tampering *within* the store; it does not authenticate
    history against someone who can recompute every hash. Anchor the head hash
    outside the store for that.
    """
    statements: list[tuple[str, tuple[object, ...]]] = []
    prev = ""
    for seq in range(MIDDLE, N + 1):
        row = _row(ledger, seq)
        forged = replace(row, data_json='{"rewritten":true}') if seq == MIDDLE else replace(row, prev_hash=prev)
        prev = row_hash(forged)
        statements += [_set("data", forged.data_json, seq), _set("prev_hash", forged.prev_hash, seq),
                       _set("hash", prev, seq)]
    statements.append(("UPDATE jixu_streams SET head_hash = ? WHERE stream = ?", (prev, STREAM)))
    _tamper(ledger, *statements)
    report = _verify(ledger)
    assert report.valid and report.count == N and report.head_hash == prev, report
